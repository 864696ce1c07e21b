"""The host contract: what Hermes calls on the engine, answered by the parts LCMEngine owns.

* `spec`             — the contract declared: every method the host calls and attribute it reads
                       or writes, when, and what the engine promises (tests/test_contract.py);
* `base`             — the 0.19.0 `ContextEngine` surface (the host's class when installed, a
                       stand-in otherwise): LCMEngine's one base class;
* `lifecycle`        — every host line: session binding, the live session and forks (told apart
                       and linked by `sessions/forks.py`), start/end/reset, the commit signal;
* `compaction_state` — newer hosts (0.20, 0.22): what they ask about compaction state (cool-down,
                       should_compress_info, the preflight deferral 0.19.0 asks too, the status
                       line), and the record of passes;
* `turn_hooks`       — newer hosts: select_context, on_turn_complete, prune_tool_results_only;
* `ingestion`        — every host line: the host's lists aligned with the stored context (the
                       pipeline's ingest stages run with the per-session state that makes a
                       re-sent list cheap), staged passes adopted or dropped by what a list carries;
* `passbudget`       — how much of the host's figure a pass may spend (its overhead, its silence
                       budget) and a pass's token budget;
* `units`            — the host's token figures in the provider's units;
* `notices`          — one line in the chat when storing stops, and one when it resumes.

LCMEngine (engine.py) owns one object of each (its attributes sessions, ingestion,
compaction_state, turn_hooks, units, notices); each receives through its constructor the store and config (callables: both
open lazily), the state the copies of an engine share, and a Protocol naming the few engine
operations it calls. None of them is a mixin and none reaches into the engine's private state.

What the engine uses *of* the host is not here: `lossless_context/hostapi.py`, the lowest layer,
imports every Hermes symbol the core uses.

Nothing here is imported by the pipeline, the stores or the summarisers: the contract sits on
top of them and below the engine.
"""
