"""Search: the query model, candidate search and ranking, shared by both stores and the tools.

* `query`      — a plain-language or identifier query planned into terms, phrases and LIKE
                 patterns (what each store's search implements);
* `regex`      — lcm_grep's regex mode, bounded in time: patterns matched in a matcher process
                 of its own (`regex_worker`), stopped at their time limit;
* `textsearch` — lcm_grep's text-mode candidate search: relax the query step by step instead
                 of scoring every match;
* `ranking`    — re-ranking candidates with what the DAG knows (covering summary, neighbours,
                 speaker, time);
* `originals`  — originals first: hits inside summaries traced back to the messages they cover;
* `traffic`    — the agent's own tool traffic (lcm_* calls and answers, the questions that asked
                 for them), told apart so it ranks below the originals it quotes;
* `semantic`   — the optional semantic arm: message vectors from a local embedding model, fused
                 with the lexical ranking for plain-language questions.

Search never crosses conversation lineages unless configured (the stores scope every query).
"""
