"""Token estimates consistent with the Hermes host's rough estimator (~4 chars/token).

Staying close to the host's `estimate_messages_tokens_rough` avoids fighting its
threshold logic: the host decides when to call compress() with the same arithmetic.
"""

from __future__ import annotations

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
