"""Summarisers and what guards them.

* `summarize`  — the summariser interface (`ModelSummarizer`), the model-backed ones (the host's
                 model, any OpenAI-compatible endpoint), escalation normal → aggressive →
                 deterministic, and validation of every reply;
* `extractive` — the built-in summariser without a model (the default: no network, no key);
* `explore`    — type-aware sketches of huge messages and tool outputs (JSON, code, logs, tables);
* `redact`     — secrets out of every text before it reaches a summariser;
* `costs`      — what summarising cost (calls, tokens, seconds, price when known).
"""
