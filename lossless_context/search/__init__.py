"""Search: the query model and the bounded regex, below the store (the stores' searches use
them; they never call a store).

* `query`        — a plain-language or identifier query planned into terms, phrases and LIKE
                   patterns (what each store's search implements), a hit's score and snippet;
* `regex`        — lcm_grep's regex mode, bounded in time: patterns matched in a matcher
                   process of its own (`regex_worker`), stopped at their time limit.

The orchestration of a grep over the stored rows (candidates, ranking, originals first, the
semantic arm) is `retrieval/`, above the store.
"""
