"""The demo: a long deterministic coding session replayed through a real engine (`lcm demo`).

Not part of the core: nothing outside this folder and the CLI imports it (the layers in
pyproject.toml, checked by `lint-imports`).

* `demo.py` — the replay, its canary checks and the tables `lcm demo` prints;
* `sessions.py` — deterministic synthetic sessions (coding, chat, mixed) with planted canaries;
* `session_data.py` — the templates and word lists the sessions are generated from;
* `session_checks.py` — checks over a generated session (OpenAI sequence, canaries present);
* `host_driver.py` — the one R19 host driver (the calls hermes-agent 0.19.0 makes), shared by the
  demo, the tests and the benchmarks.
"""

from .demo import DemoResult, expand_message, print_tables, replay, run_demo, with_timestamps

__all__ = ["DemoResult", "expand_message", "print_tables", "replay", "run_demo", "with_timestamps"]
