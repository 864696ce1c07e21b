"""Summarisers and what guards them.

* `summarize`  — the summariser interface (`Summarizer`), which the built-in
                 `ExtractiveSummarizer` and the model-backed ones (`ModelSummarizer`: the host's
                 model, any OpenAI-compatible endpoint) all implement; escalation normal →
                 aggressive → deterministic (`Escalator`), and validation of every reply;
* `extractive` — the built-in summariser without a model (the default: no network, no key);
* `explore`    — type-aware sketches of huge messages and tool outputs (JSON, code, logs, tables);
* `redact`     — secrets out of every text before it reaches a summariser;
* `costs`      — what summarising cost (calls, tokens, seconds, price when known).
"""
