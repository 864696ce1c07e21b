"""Edits of the stored history outside a compaction pass, asked for by the user (`lcm forget`,
`lcm resummarize`, retention) or by `lcm doctor --repair`. They build on the pipeline's parts
(slots, source texts, the DAG's depth bound) and the store; no pass calls them.

* `forget`        — forgetting a session or single messages for good (every summary built
                    over them rebuilt or dropped), and hiding messages the host rolled back;
* `resummarize`   — one summary node re-summarised with the current summariser, in place;
* `dag_rebalance` — a summary chain left by 0.1.x rebuilt into a balanced tree, losing nothing.

(The marks that keep a forgotten message from being stored again are read by the ingest
stage: `pipeline/forgotten.py`.)
"""
