"""Benchmarks for lossless-context: `python -m bench [--quick | --full] [--only NAME]`.

Parts (each a module with a `run(cfg) -> dict`):

* `scale`        — cost curves of our engine as the stored history grows (1k … 1M messages);
* `side_by_side` — our engine vs the built-in `ContextCompressor` of hermes-agent, same host calls,
                   same deterministic summariser server, canary recall;
* `quality`      — a model-free summary-quality metric (share of identifiers/paths/numbers/quotes kept);
* `backends`     — SQLite vs PostgreSQL on ingest, compaction and search.

Results go to `bench/RESULTS.md` (tables + machine description) and `bench/results.json`.
Everything is measured as ratios against a baseline in the same run, or as growth curves;
nothing here is a timed assertion.
"""
