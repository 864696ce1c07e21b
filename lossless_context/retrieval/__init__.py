"""Retrieval: lcm_grep's orchestration over the store — which stored rows a search looks at and
how they rank. It sits above the store and reads it only through the store's search API
(`store/search_api.py`); the query planning it starts from (`search/`) sits below the store.

* `grep`       — one page of lcm_grep hits: text mode (`textsearch`) or regex mode (newest first);
* `textsearch` — lcm_grep's text-mode candidate search: relax the query step by step instead
                 of scoring every match;
* `ranking`    — re-ranking candidates with what the DAG knows (covering summary, neighbours,
                 speaker, time);
* `originals`  — originals first: hits inside summaries traced back to the messages they cover;
* `traffic`    — the agent's own tool traffic (lcm_* calls and answers, the questions that asked
                 for them), told apart so it ranks below the originals it quotes;
* `semantic`   — the optional semantic arm: message vectors from a local embedding model, fused
                 with the lexical ranking for plain-language questions.

Search never crosses conversation lineages unless configured: every function takes the
lineage's sessions (its scope) and hands them to the store, which applies them in its query.
"""
