"""What a summariser is sent of one stored message: its digest.

A summary is read instead of the messages it covers, and every original stays one `lcm_expand`
away, so a summariser needs the facts of a message, not its bulk. People's words (user and
assistant text) go in whole; machine-made text is cut where a summary would not keep it:

* a tool-output stub (tier 0) goes in without its head/tail lines and type sketch: its header,
  exit status, every error line and its paths/ids/numbers lines stay;
* long string values inside JSON — tool-call arguments (`patch`'s old and new strings,
  `write_file`'s content) and JSON tool results (a diff) — keep their start and end, with the
  number of characters left out and the message id to expand;
* non-JSON arguments are capped, as the host's own compressor caps them.

Deterministic (the background worker and a pass must cut the same chunks) and never longer
than the message's own text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping  # (isinstance against it: ~6x cheaper than typing's alias)
from typing import Any

from ..messages import flatten_content

STRING_CHARS = 240  # a JSON string value longer than this is cut in the middle
STRING_HEAD = 160  # ... keeping this many characters of its start
STRING_TAIL = 60  # ... and this many of its end
ARGS_CHARS = 1500  # non-JSON tool-call arguments beyond this are cut
_STUB_DROPPED_SECTIONS = ("head:", "tail:")
# A stub's header: "<mark> tool: NAME(ARGS) · KIND, N chars, N lines, ~N tokens[ · ERROR]".
_STUB_HEADER_RE = re.compile(r"^(?P<lead>.*? tool: [\w.:-]+)\(.*\)(?P<size> · [^·]*?, [\d,]+ chars, [\d,]+ lines, "
                             r"~[\d,]+ tokens(?: · ERROR)?)$")


def stub_digest(stub: str) -> str:
    """A tier-0 stub without its head/tail lines and the sketch after them.

    Everything before the first `head:`/`tail:` label stays: the header (tool, size, ERROR),
    the exit status and JSON facts, every error line, and the paths/ids/numbers lines. The
    header names the tool without its arguments: the call just before the result shows them.
    """
    lines = stub.split("\n")
    m = _STUB_HEADER_RE.match(lines[0])
    if m:
        lines[0] = f"{m.group('lead')}(…){m.group('size')}"
    for i, line in enumerate(lines):
        if i and line in _STUB_DROPPED_SECTIONS:
            return "\n".join(lines[:i])
    return "\n".join(lines)


def _shorten(value: Any, ref: str) -> Any:
    if isinstance(value, str):
        if len(value) <= STRING_CHARS:
            return value
        cut = len(value) - STRING_HEAD - STRING_TAIL
        return f"{value[:STRING_HEAD]}…[{cut:,} chars; expand {ref}]…{value[-STRING_TAIL:]}"
    if isinstance(value, list):
        return [_shorten(v, ref) for v in value]
    if isinstance(value, dict):
        return {k: _shorten(v, ref) for k, v in value.items()}
    return value


def shorten_json(text: str, ref: str) -> str | None:
    """`text` with its long JSON string values cut in the middle; None when it is not a JSON
    object or array (or nothing in it is long)."""
    s = text.lstrip()
    if not s.startswith(("{", "[")) or len(text) <= STRING_CHARS:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    try:
        out = json.dumps(_shorten(data, ref), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return None
    return out if len(out) < len(text) else None


def _call_line(call: Any, ref: str) -> str | None:
    if not isinstance(call, Mapping):
        return None
    fn = f if isinstance(f := call.get("function"), Mapping) else {}
    args = fn.get("arguments")
    if not isinstance(args, str):
        try:
            args = json.dumps(args, ensure_ascii=False)
        except (ValueError, TypeError, RecursionError):
            args = str(args)
    short = shorten_json(args, ref)
    if short is not None:
        args = short
    elif len(args) > ARGS_CHARS:
        args = f"{args[:ARGS_CHARS]}…[{len(args) - ARGS_CHARS:,} chars; expand {ref}]"
    return f"→ {fn.get('name')}({' '.join(args.split())})"


def digest(role: str, raw: Any, text: str, ref: str, stub: str | None = None) -> str:
    """The digest of one message: `text` is its stored searchable text, `raw` the message as
    the host sent it, `ref` its id for `lcm_expand` ("m12"), `stub` its tier-0 stub if any."""
    if stub is not None:
        return stub_digest(stub)
    if not isinstance(raw, Mapping):
        return text
    if role == "assistant" and isinstance(raw.get("tool_calls"), list) and raw["tool_calls"]:
        lines = [ln for ln in (_call_line(c, ref) for c in raw["tool_calls"]) if ln is not None]
        body = flatten_content(raw.get("content"))
        out = "\n".join(([body] if body else []) + lines)
        return out if len(out) < len(text) else text
    if role == "tool":
        short = shorten_json(text, ref)
        return short if short is not None else text
    return text

