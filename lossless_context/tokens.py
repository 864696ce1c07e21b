"""Token estimates consistent with the Hermes host's rough estimator (~4 chars/token).

Staying close to the host's `estimate_messages_tokens_rough` avoids fighting its
threshold logic: the host decides when to call compress() with the same arithmetic.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping

IMAGE_TOKEN_COST = 1500
_IMAGE_TYPES = ("image", "image_url", "input_image")  # a tuple: a hostile "type" may be unhashable


def estimate_text_tokens(text: str | None) -> int:
    if not text:
        return 0
    return (len(text) + 3) // 4


def _shadow(msg: Mapping[str, Any]) -> tuple[dict, int]:
    shadow: dict[str, Any] = {}
    images = 0
    for k, v in msg.items():
        if k.startswith("_"):
            continue  # host-private and identity fields are never sent to the provider
        if k == "content" and isinstance(v, list):
            cleaned = []
            for part in v:
                if isinstance(part, dict) and part.get("type") in _IMAGE_TYPES:
                    images += 1
                    cleaned.append({"type": part.get("type"), "image": "[stripped]"})
                elif isinstance(part, dict) and part.get("type") == "input_audio":
                    cleaned.append({"type": "input_audio", "audio": "[stripped]"})
                    images += 1
                else:
                    cleaned.append(part)
            shadow[k] = cleaned
        else:
            shadow[k] = v
    return shadow, images


_CTRL = bytes(range(32)) + b"\x7f"


def _repr_len(s: str) -> int:
    """len(repr(s)) without building it (an ASCII text's escapes are counted in C)."""
    if not s.isascii():
        return len(repr(s))
    b = s.encode("ascii")
    n = len(b)
    extra = b.count(b"\\")
    ctrl = n - len(b.translate(None, _CTRL))
    if ctrl:  # \t \n \r take 2 characters, other controls \xNN take 4
        nl, cr, tab = b.count(b"\n"), b.count(b"\r"), b.count(b"\t")
        extra += nl + cr + tab + 3 * (ctrl - nl - cr - tab)
    sq = b.count(b"'")
    if sq and b.count(b'"'):  # with both quotes present, repr escapes its own (')
        extra += sq
    return n + 2 + extra


def _str_len(msg: dict) -> int:
    """len(str(msg)) for a plain dict; long string values are measured without their repr."""
    total = 4 * len(msg)  # "{" "}", a ": " per entry and a ", " between entries
    for k, v in msg.items():
        total += len(repr(k))
        if type(v) is str and len(v) > 256:  # counting pays off only for long texts
            total += _repr_len(v)
        else:
            total += len(repr(v))
    return total if msg else 2


def estimate_message_tokens(msg: Any) -> int:
    """Tokens one message costs in a request (base64 media at a flat rate)."""
    if not isinstance(msg, dict):
        return estimate_text_tokens(str(msg))
    if type(msg) is dict and not isinstance(msg.get("content"), list) \
            and not any(k.startswith("_") for k in msg):
        # Nothing to strip: the shadow would be an equal plain dict, so its str is this one's.
        return (_str_len(msg) + 3) // 4
    shadow, images = _shadow(msg)
    return (len(str(shadow)) + 3) // 4 + images * IMAGE_TOKEN_COST


def estimate_messages_tokens(messages: Iterable[Any]) -> int:
    return sum(estimate_message_tokens(m) for m in messages)


def measured_messages(messages: Iterable[Any], known: Mapping[int, tuple[Any, int]] | None = None,
                      ) -> tuple[int, dict[int, tuple[Any, int]]]:
    """`estimate_messages_tokens(messages)`, and each object's estimate by id (the object kept
    with it, so its id stays its own): a caller measuring lists of mostly the same objects
    again looks them up there. `known`: estimates made already in the same call (the ingest's
    of the messages it stored), by id, each with its object (alive, so the id is still its own)."""
    memo: dict[int, tuple[Any, int]] = {}
    total = 0
    for m in messages:
        hit = known.get(id(m)) if known else None
        n = hit[1] if hit is not None else estimate_message_tokens(m)
        memo[id(m)] = (m, n)
        total += n
    return total, memo


class ProviderRatio:
    """The provider's prompt tokens per token of our estimate, learned per session (>= 1).

    Our estimate is ~chars/4; a provider's tokenizer may count far more (about one token per
    CJK character: ~4x; code's operators and brackets). The host hands us its figures — the
    provider's own count (after a response, after a tool batch, 0.22's usage-anchored figure)
    or a rough chars/4 one — and the window is in the provider's units, so a pass plans with
    the window divided by this ratio.

    One figure is read against our estimate of the messages it counted: what exceeds the
    estimate by no more than `cap` (a share of the window) may be the host's overhead (system
    prompt, tool schemas) at ratio 1, so it can only *raise* a ratio learned before (by the
    least ratio it implies); a larger excess is a denser tokenizer for sure, and sets the ratio
    (at once when higher; halfway when lower, so one odd figure does not undo it).
    """

    MAX = 8.0  # no tokenizer counts more than this many tokens per 4 characters
    SESSIONS = 256  # sessions remembered per engine family

    def __init__(self) -> None:
        self._by_session: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str | None) -> float:
        with self._lock:
            return self._by_session.get(session_id or "", 1.0)

    def observe(self, session_id: str | None, figure: Any, estimate: int, overhead: int, cap: int) -> float:
        """Learn from one figure of the provider (or the host) for messages we estimate at
        `estimate` tokens, with `overhead` our estimate of what the host adds; the ratio now."""
        if isinstance(figure, bool) or not isinstance(figure, (int, float)) or figure != figure:
            return self.get(session_id)
        if figure <= 0 or estimate <= 0 or figure == float("inf"):
            return self.get(session_id)
        key = session_id or ""
        with self._lock:
            r = self._by_session.get(key, 1.0)
            if figure - estimate <= cap:
                new = max(r, min(self.MAX, figure / (estimate + max(0, cap))))
            else:
                seen = min(self.MAX, max(1.0, figure / (estimate + max(0, overhead))))
                new = seen if seen > r else (r + seen) / 2
            new = 1.0 if new < 1.05 else new
            self._by_session.pop(key, None)
            self._by_session[key] = new
            while len(self._by_session) > self.SESSIONS:
                self._by_session.pop(next(iter(self._by_session)))
            return new
