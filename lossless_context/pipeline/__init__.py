"""The one-way pipeline, in reading order: host list → stored messages → summary DAG → context.

1. `ingest`        — align the host's list with the known context; store what is new, verbatim:
                     the plain walk; the engine runs the same walk with its fast paths
                     (`ingest_fast`: identity memo, pipelined store, `gcpause`; `ingest_resume`:
                     resuming where the last call ended) — tests/test_ingest_oracle.py checks
                     that both store and return the same; `ingest_replay` folds a list that
                     replays originals back into the summaries that cover them; `unmerge` first
                     splits our block back out of a neighbour the host merged it into
                     (the engine runs these stages through contract/ingestion.py);
2. `stubs`         — tier 0: old tool results shown as stubs, before any summary (`stub_prep`:
                     each result's stub made when it is stored, in a thread, off the pass);
3. `digest`        — what a summariser is sent of each message;
4. `compaction`    — pick the span, build leaf and condensed nodes (`dag_balance` keeps the DAG
                     a hierarchy; `continuity` keeps the task in view);
5. `assemble`      — system + head + summary message + tail: a valid OpenAI list by construction,
                     the block's role, the host's reply anchor, and the trim that keeps a session
                     within its window while the store is unavailable
                     (`validate`: what "valid" means, checked in one place);
6. `background`    — summarising ahead of time and upgrading deterministic nodes off the hot path;
7. views           — `context_view`, `summary_view` (what the model sees, what a node covers);
                     `forgotten`: the marks that keep a forgotten message from being stored again
                     when a live host hands it over (ingest reads them).

(Which engine staged a pass is `store/owners.py`; the exact originals behind a hit,
`retrieval/originals.py`; host forks and branches, `sessions/forks.py`; forgetting,
re-summarising and rebalancing outside a pass, `edits/`.)

Modules here use the stores through `store.base.Store` and summarisers through
`summarizers.summarize`; they never import the contract, the CLI, the adapter or the demo.
"""
