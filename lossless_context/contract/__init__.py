"""The host contract: what Hermes calls on the engine, and what the engine uses of Hermes.

* `spec`       — the contract declared: every method the host calls and attribute it reads or
                 writes, when, and what the engine promises (checked by tests/test_contract.py);
* `base`       — the 0.19.0 `ContextEngine` surface (the host's class when installed, a
                 stand-in otherwise): every method the host calls and attribute it reads;
* `hooks_r19`  — signals the 0.19.0 host sends besides compress() (usage, resets, /compress);
* `hooks_main` — upstream main's additions (status line, select_context, prune, cooldowns);
* `lifecycle`  — session binding, the live session and forks (told apart and linked by
                 `sessions/forks.py`), start/end/reset, the commit signal;
* `passbudget` — how much of the host's figure a pass may spend (its overhead, its silence budget);
* `units`      — the host's token figures in the provider's units (a mixin of LCMEngine);
* `notices`    — one line in the chat when storing stops, and one when it resumes (a mixin).

What the engine uses *of* the host is not here: `lossless_context/hostapi.py`, the lowest layer,
imports every Hermes symbol the core uses.

Nothing here is imported by the pipeline, the stores or the summarisers: the contract sits on
top of them (LCMEngine in `engine.py` mixes these in).
"""
