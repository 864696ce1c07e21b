"""Text tools the pipeline and the summarisers share: pure, deterministic, bounded in time on
multi-megabyte input, never raising; they know nothing of the store.

* `explore` — type-aware sketches of huge messages and tool outputs (JSON, YAML, CSV, code,
              logs, prose): what the model is shown of a message too large to show;
* `redact`  — secrets out of every text before it reaches a summariser, and out of summaries.
"""
