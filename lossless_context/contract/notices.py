"""One line in the chat when storing stops, and one when it resumes (an object LCMEngine owns).

The log tells an operator; the user in the chat is told through what every host shows:

* storing stops: the first pass that falls back without the store (store/guard.py) sets
  `_last_summary_error`, which 0.19.0, 0.20 and 0.22 all print once per distinct text after a
  pass that changed the context ("⚠ Compression summary failed: <ours>"); on a host with the
  automatic-compaction status line (0.20+), an outage already known when a pass starts is
  told in that line instead;
* storing resumes: the status line of the next pass (0.20+; 0.19.0 has no line an engine
  can use for good news: `/lcm status` and the log say it there).

Each is told once per outage, for the whole engine family (every copy of the engine).
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable

from ..store import Store
from ..store.guard import StoreUnavailable


class StoreNotices:
    """The notices of one engine; the state lives in the family shared by every copy. `store`
    opens the engine's store (lazily: it may raise StoreUnavailable)."""

    def __init__(self, family: dict[str, Any], store: Callable[[], Store]) -> None:
        self._family = family
        self._store = store

    def _notices(self) -> tuple[dict[str, Any], threading.Lock]:
        fam = self._family
        if "notices" not in fam:
            fam.setdefault("notices_lock", threading.Lock())
            fam.setdefault("notices", {"told_down": False, "location": ""})
        return fam["notices"], fam["notices_lock"]

    def _breaker(self) -> Any:
        try:
            return getattr(self._store(), "breaker", None)
        except Exception:
            return None

    def store_stopped_line(self, exc: StoreUnavailable) -> str | None:
        """The line for the first fallback of an outage (None when it was told already)."""
        state, lock = self._notices()
        with lock:
            if state["told_down"]:
                return None
            state["told_down"], state["location"] = True, exc.location
        return (f"LCM stopped storing: the store at {exc.location} is unavailable ({_first_line(exc.reason)}). "
                f"Until it is back the oldest turns leave the context (the host's own history keeps them) "
                f"and nothing new is stored; /lcm status shows the state")

    def store_pending_lines(self) -> str | None:
        """For a pass's status line: an outage not told yet, or the end of one that was."""
        state, lock = self._notices()
        breaker = self._breaker()
        down = bool(breaker is not None and breaker.is_open)
        with lock:
            if down and not state["told_down"]:
                state["told_down"], state["location"] = True, getattr(breaker, "location", "")
                return (f"LCM stopped storing: the store at {state['location']} is unavailable; until it is "
                        f"back the oldest turns leave the context (the host's history keeps them)")
            if not down and state["told_down"]:
                state["told_down"] = False
                return (f"LCM is storing again: the store at {state['location']} answers (turns of the "
                        f"outage stay only in the host's history)")
        return None


def _first_line(text: str) -> str:
    text = re.sub(r" \(retrying in \d+ s\)$", "", (text or "").strip())  # (the breaker's own note)
    line = text.splitlines()[0] if text else "no reason given"
    return line if len(line) <= 300 else line[:297] + "..."
