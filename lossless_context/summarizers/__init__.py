"""Summarisers and what guards them (the text tools they share with the pipeline, exploration
and secret redaction, are `text/`).

* `summarize`  — the summariser interface (`Summarizer`), which the built-in
                 `ExtractiveSummarizer` and the model-backed ones (`ModelSummarizer`: the host's
                 model, any OpenAI-compatible endpoint) all implement; escalation normal →
                 aggressive → deterministic (`Escalator`), and validation of every reply;
* `extractive` — the built-in summariser without a model (the default: no network, no key);
* `costs`      — what summarising cost (calls, tokens, seconds, price when known).
"""
