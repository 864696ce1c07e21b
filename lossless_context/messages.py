"""Message identity, provider views and text flattening.

On the released host (R19) messages have no ids and carry host-only keys that differ
between a live and a resumed session, so identity is a hash of what the provider sees.
Newer hosts stamp `message_uid`; then the uid is the identity and content is a version.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping  # (isinstance against it: ~6x cheaper than typing's alias)
from typing import Any

PROVIDER_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
ROLES = ("system", "user", "assistant", "tool", "function", "developer")
_UID_RE = re.compile(r"^[0-9a-f]{32}$")
# A tuple, not a set: a hostile part may carry an unhashable "type" (a list), and `in` must not raise.
_MEDIA_TYPES = ("image", "image_url", "input_image", "input_audio", "audio", "file")

# A marker inside summary text that survives the host merging our summary into a
# neighbour of the same role: we recognise our summaries by it, never by a prefix.
SUMMARY_OPEN = '<lcm-summary nodes="'
SUMMARY_MARKER_RE = re.compile(r'<lcm-summary nodes="([0-9s,]*)"')


# The scripts both stores index for substring search (CJK, kana, Hangul), defined once: the
# ranges of the SQLite GLOB in migrations 006/007 and of PostgreSQL's lcm_cjk_grams (migration
# 008) — those migrations are history and keep their own copy; every Python user takes this one.
CJK_CLASS = "[\u2e80-\u9fff\uac00-\ud7af\u3040-\u30ff]"
_CJK_CHAR_RE = re.compile(CJK_CLASS)


def has_cjk(text: str) -> bool:
    """True if `text` holds a CJK/kana/Hangul character (ASCII text is ruled out in C speed)."""
    return not text.isascii() and _CJK_CHAR_RE.search(text) is not None


def clean_text(s: str) -> str:
    """Text safe for any store: lone surrogates replaced, NUL bytes dropped."""
    if not s:
        return s
    if not s.isascii():
        try:
            s.encode("utf-8")  # fails only on a lone surrogate: then the (slower) repair
        except UnicodeEncodeError:
            s = s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return s.replace("\x00", "") if "\x00" in s else s


_clean = clean_text


# Built once: json.dumps with non-default options constructs an encoder on every call.
_SAFE_JSON = json.JSONEncoder(ensure_ascii=True, sort_keys=False, default=repr).encode
_IDENT_JSON = json.JSONEncoder(ensure_ascii=True, sort_keys=True, default=repr).encode
_json_str = json.encoder.encode_basestring_ascii  # what both encoders use for a str
# _SAFE_JSON's own C encoder, made once and without the reference-cycle bookkeeping (a
# dict per call): the same text ~25% sooner. A cycle ends in RecursionError, then the
# careful path below takes over.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)  # (CPython's; not in the type stubs)
_FAST_JSON = (_c_make_encoder(None, repr, _json_str, None, ": ", ", ", False, False, True)
              if _c_make_encoder is not None else None)
_MAX_DEPTH = 100
_UNENCODABLE = (ValueError, TypeError, RecursionError)


def safe_json(obj: Any) -> str:
    """JSON that never raises: unknown objects become strings, surrogates survive; a
    reference cycle or a key JSON cannot spell becomes a marker string (see _encodable)."""
    if _FAST_JSON is not None:
        try:
            return "".join(_FAST_JSON(obj, 0))
        except _UNENCODABLE:
            pass
    return _encode_any(_SAFE_JSON, obj)


def _encode_any(encode: Any, obj: Any) -> str:
    try:
        return encode(obj)
    except _UNENCODABLE:  # a cycle, a tuple key, absurd nesting: a message must still be stored
        return encode(_encodable(obj))


def _encodable(obj: Any, path: frozenset[int] = frozenset(), depth: int = 0) -> Any:
    """A copy of `obj` that JSON can spell: a reference back to an enclosing container is
    "[circular reference]", a key that is not str/int/float/bool/None is its repr, nesting
    deeper than _MAX_DEPTH is "[nested too deep]". Only for input the encoder refused."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if not isinstance(obj, (Mapping, list, tuple)):
        return repr(obj)
    if id(obj) in path:
        return "[circular reference]"
    if depth >= _MAX_DEPTH:
        return "[nested too deep]"
    inner = path | {id(obj)}
    if isinstance(obj, Mapping):
        return {(k if isinstance(k, (str, int, float, bool)) or k is None else repr(k)):
                _encodable(v, inner, depth + 1) for k, v in obj.items()}
    return [_encodable(v, inner, depth + 1) for v in obj]


def _normal_tool_calls(tcs: Any) -> Any:
    if not isinstance(tcs, list):
        return tcs
    out = []
    for tc in tcs:
        if _is_map(tc):
            fn = tc.get("function") if _is_map(tc.get("function")) else {}
            out.append([tc.get("id"), tc.get("type"), fn.get("name"), fn.get("arguments")])
        else:
            out.append(tc)
    return out


def _is_map(x: Any) -> bool:
    # A plain dict first: the ABC check behind isinstance(x, Mapping) is ~20x slower.
    return type(x) is dict or isinstance(x, Mapping)


def _json_atom(x: Any) -> str | None:
    """The encoder's text for a str or None; None for anything else (use the encoder)."""
    if x is None:
        return "null"
    return _json_str(x) if type(x) is str else None


def _ident_rest(role: Any, tcs: Any, tcid: Any, name: Any) -> str:
    """json.dumps([role, normal tool calls, tool_call_id, name]) exactly as the ident has it.

    The common shapes (strings, None, tool calls as plain dicts of strings) are spelled out
    with the encoder's own string escaper and ", " separators: the same bytes, without the
    per-call encoder setup that cost more than the hashing.
    """
    if tcs is None and type(role) is str and (tcid is None or type(tcid) is str) and name is None:
        # The commonest shape (no tool calls, no name), spelled out at once.
        return "[" + _json_str(role) + ", null, " + ("null" if tcid is None else _json_str(tcid)) + ", null]"
    parts: list[Any] = [_json_atom(role), "null", _json_atom(tcid), _json_atom(name)]
    if tcs is not None:
        parts[1] = None
        if type(tcs) is list:
            rows = []
            for tc in tcs:
                fn = tc.get("function") if type(tc) is dict else None
                if type(fn) is not dict:
                    break
                row: list[Any] = [_json_atom(tc.get("id")), _json_atom(tc.get("type")),
                                  _json_atom(fn.get("name")), _json_atom(fn.get("arguments"))]
                if None in row:
                    break
                rows.append("[" + ", ".join(row) + "]")
            else:
                parts[1] = "[" + ", ".join(rows) + "]"
    if None in parts:
        return _encode_any(_IDENT_JSON, [role, _normal_tool_calls(tcs), tcid, name])
    return "[" + ", ".join(parts) + "]"


def content_ident(msg: Any) -> str:
    """32-hex identity of what the provider sees of a message.

    Plain string content (the common, large case) is hashed directly rather than through
    json.dumps of the whole message, which dominated ingestion time. The bytes hashed must
    never change: stored idents are compared with fresh ones (tests/support/ingest_oracle.py).
    """
    if isinstance(msg, dict):
        content = msg.get("content")
        role = msg.get("role")
        # A live tool result carries `name`; the host's reload of the same row has only
        # `tool_name`, and it strips message text: neither may make it a new message.
        name = None if role == "tool" else msg.get("name")
        rest = _ident_rest(role, msg.get("tool_calls"), msg.get("tool_call_id"), name)
        if isinstance(content, str):
            h = hashlib.blake2b(b"s\x1f", digest_size=16)
            h.update(content.strip().encode("utf-8", "surrogatepass"))
        else:
            h = hashlib.blake2b(b"j\x1f", digest_size=16)
            h.update(b"null" if content is None else _encode_any(_IDENT_JSON, content).encode("ascii"))
        h.update(b"\x1e")
        h.update(rest.encode("ascii"))
    else:
        h = hashlib.blake2b(b"?\x1f" + repr(msg).encode("utf-8", "surrogatepass"), digest_size=16)
    return h.hexdigest()


_MEMO_SESSIONS = 4  # sessions whose last list's idents are kept
_memos: OrderedDict[str, dict[int, tuple]] = OrderedDict()
_memos_lock = threading.Lock()


def plain_tool_calls(tcs: Any) -> list[tuple[tuple, dict, dict]] | None:
    """Per call of a list of plain-dict tool calls whose id, type, function name and
    arguments are str/None (all the ident renders of them): those four, the call dict and
    its function dict; None for anything else."""
    if type(tcs) is not list:
        return None
    out = []
    for tc in tcs:
        fn = tc.get("function") if type(tc) is dict else None
        if type(fn) is not dict:
            return None
        row = (tc.get("id"), tc.get("type"), fn.get("name"), fn.get("arguments"))
        for x in row:
            if x is not None and type(x) is not str:
                return None
        out.append((row, tc, fn))
    return out


def calls_key(tcs: Any) -> tuple | None:
    """The str/None fields of plain-dict tool calls (what the ident renders of them), else None.

    Equal keys render to equal JSON; cheaper to compare than rendering again.
    """
    calls = plain_tool_calls(tcs)
    return None if calls is None else tuple(row for row, _, _ in calls)


class IdentMemo:
    """content_ident() over a host's list, reusing the previous call's results.

    The host hands the same growing list over and over; hashing every message again made
    re-alignment cost as much as storing. A result is reused only when the message's
    content, role, tool_call_id and name are the very same str/None objects as last time
    (immutable: same object, same value) and its tool calls render to the same text, so
    it is exactly content_ident(msg). The dict's id is only the lookup key. Only the last
    list of a few sessions is kept: nothing outlives what the host itself still holds.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        with _memos_lock:
            self.old = _memos.pop(key, {})
        self.new: dict[int, tuple] = {}

    def ident(self, msg: Any) -> str:
        if type(msg) is not dict:
            return content_ident(msg)
        content, role, tcid = msg.get("content"), msg.get("role"), msg.get("tool_call_id")
        if not (type(role) is str and (content is None or type(content) is str)
                and (tcid is None or type(tcid) is str)):
            return content_ident(msg)
        name = None if role == "tool" else msg.get("name")
        if not (name is None or type(name) is str):
            return content_ident(msg)
        tcs = msg.get("tool_calls")
        calls = None if tcs is None else (calls_key(tcs) or _ident_rest(role, tcs, tcid, name))
        hit = self.old.get(id(msg))
        if (hit is not None and hit[0] is content and hit[1] is role and hit[2] is tcid and hit[3] is name
                and hit[4] == calls):
            ident = hit[5]
        else:
            ident = content_ident(msg)
        self.new[id(msg)] = (content, role, tcid, name, calls, ident)
        return ident

    def keep_previous(self) -> None:
        """Carry the previous list's entries over (the caller verified those messages are
        unchanged without asking the memo), so a later call can still reuse them."""
        merged = dict(self.old)
        merged.update(self.new)
        self.new = merged

    def save(self) -> None:
        with _memos_lock:
            _memos[self.key] = self.new
            _memos.move_to_end(self.key)
            while len(_memos) > _MEMO_SESSIONS:
                _memos.popitem(last=False)


def message_uid(msg: Any) -> str | None:
    if isinstance(msg, dict):
        uid = msg.get("message_uid")
        if isinstance(uid, str) and _UID_RE.match(uid):
            return uid
    return None


def absorbed_uids(msg: Any) -> list[str]:
    if isinstance(msg, dict):
        v = msg.get("_absorbed_message_uids")
        if isinstance(v, list):
            return [u for u in v if isinstance(u, str) and _UID_RE.match(u)]
    return []


def role_of(msg: Any) -> str:
    if isinstance(msg, dict):
        r = msg.get("role")
        if isinstance(r, str) and r in ROLES:
            return r
        return "unknown"
    return "invalid"


# Hermes' gateway writes "[Display Name] text" into every user message of a session shared
# by several people (gateway/run.py, shared multi-user sessions): that prefix is the speaker.
_SPEAKER_PREFIX = re.compile(r"\[([^\[\]\n]{1,64})\] ")


def speaker_of(msg: Any) -> str | None:
    """Who said a message, when the message says: OpenAI's ``name`` field, else the
    ``[Name] `` prefix Hermes' gateway puts on user messages in shared sessions. ``None``
    when only the role is known."""
    if not isinstance(msg, dict):
        return None
    name = msg.get("name")
    if isinstance(name, str) and name.strip() and msg.get("role") in ("user", "assistant"):
        return " ".join(name.split())[:64]
    content = msg.get("content")
    if msg.get("role") == "user" and isinstance(content, str):
        m = _SPEAKER_PREFIX.match(content)
        if m and m.group(1).strip():
            return " ".join(m.group(1).split())
    return None


def tool_call_ids(msg: Any) -> list[str]:
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return []
    tcs = msg.get("tool_calls")
    if not isinstance(tcs, list):
        return []
    return [tc.get("id") for tc in tcs if _is_map(tc) and isinstance(tc.get("id"), str)]


def provider_view(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The message as a provider should see it: persistence-only fields stripped."""
    out = {k: msg[k] for k in PROVIDER_KEYS if k in msg}
    for k in ("reasoning_content", "reasoning_details", "refusal"):
        if k in msg and msg[k] is not None:
            out[k] = msg[k]
    return out


_DATA_URL = re.compile(r"^data:([\w.+-]+)/([\w.+-]+)(?:;[^,;]*)*;base64,", re.I)
MEDIA_INLINE_CHARS = 512  # inline media shorter than this (a tiny icon) is shown as it is


def _media_label(mime: str, b64_chars: int) -> str:
    major, _, sub = mime.partition("/")
    kb = b64_chars * 3 // 4 / 1024
    size = f"{kb:,.0f} KB" if kb >= 10 else f"{kb:.1f} KB"
    return f"[{(major or 'media').lower()}: {(sub or major).lower()}, {size}]"


def media_shown(value: Any, _depth: int = 0) -> Any:
    """A copy of a stored message value with inline media (``data:`` URLs, base64 ``source``
    blocks) replaced by a label such as ``[image: png, 270 KB]``; everything else as it is.
    What ``lcm_expand`` shows unless the raw form is asked for: a 270 KB image is 23 pages
    of base64 no reader can use."""
    if _depth > 32:
        return value
    if isinstance(value, str):
        if len(value) >= MEDIA_INLINE_CHARS and value.startswith("data:"):
            mo = _DATA_URL.match(value)
            if mo:
                return _media_label(f"{mo.group(1)}/{mo.group(2)}", len(value) - mo.end())
        return value
    if isinstance(value, list):
        return [media_shown(v, _depth + 1) for v in value]
    if isinstance(value, Mapping):
        data = value.get("data")
        if (value.get("type") == "base64" and isinstance(data, str) and len(data) >= MEDIA_INLINE_CHARS):
            mime = value.get("media_type") or value.get("mime_type") or "application/octet-stream"
            return {**{k: v for k, v in value.items() if k != "data"},
                    "data": _media_label(str(mime), len(data))}
        return {k: media_shown(v, _depth + 1) for k, v in value.items()}
    return value


def flatten_content(content: Any, limit: int | None = None, _depth: int = 0) -> str:
    """Plain text of a content value; media parts become short references, never base64."""
    if content is None:
        return ""
    if _depth > 16:  # a content holding itself (hostile input) must not recurse forever
        return "[nested content]"
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                ptype = part.get("type")
                if ptype in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif ptype in _MEDIA_TYPES:
                    parts.append(f"[{ptype} attachment]")
                elif isinstance(part.get("text"), str):
                    parts.append(part["text"])
                else:
                    parts.append(f"[{ptype or 'part'}]")
            elif isinstance(part, str):
                parts.append(part)
            else:
                parts.append(safe_json(part)[:2000])
        text = "\n".join(parts)
    elif isinstance(content, Mapping):
        if isinstance(content.get("text_summary"), str):
            text = content["text_summary"]
        elif content.get("type") in _MEDIA_TYPES:  # one media part given as the whole content
            text = f"[{content.get('type')} attachment]"
        else:
            text = (flatten_content(content.get("content"), _depth=_depth + 1) if "content" in content
                    else safe_json(content))
    else:
        text = str(content)
    text = _clean(text.replace("\x00", ""))
    if limit is not None and len(text) > limit:
        text = text[:limit]
    return text


def message_text(msg: Any, limit: int | None = None) -> str:
    """Searchable/summarisable text of a message, tool calls rendered as text."""
    if not isinstance(msg, dict):
        return _clean(str(msg).replace("\x00", ""))[: limit or None]
    text = flatten_content(msg.get("content"))
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        rendered = []
        for tc in calls:
            if _is_map(tc):
                fn = tc.get("function") if _is_map(tc.get("function")) else {}
                args = fn.get("arguments")
                if not isinstance(args, str):
                    args = safe_json(args)
                rendered.append(f"→ {fn.get('name')}({_clean(args)[:4000]})")
        if rendered:
            text = (text + "\n" if text else "") + "\n".join(rendered)
    if limit is not None and len(text) > limit:
        text = text[:limit]
    return text


def is_summary_message(msg: Any) -> bool:
    if not isinstance(msg, dict):
        return False
    c = msg.get("content")
    if isinstance(c, str):  # the common case, without copying the text
        return SUMMARY_OPEN in c
    return c is not None and SUMMARY_OPEN in flatten_content(c)


def summary_node_ids(msg: Any) -> list[int]:
    """Node ids named by our summary marker (survives merges into a neighbour)."""
    if not isinstance(msg, dict):
        return []
    c = msg.get("content")
    # A pass and a commit scan the host's whole list for our marker (contract/ingestion.py):
    # a string without it is left at once. flatten_content of a string only drops NULs (which
    # could join a marker) and repairs lone surrogates (never into ASCII), so without a NUL
    # the marker is in the flattened text only if it is in the string.
    if type(c) is str and SUMMARY_OPEN not in c and "\x00" not in c:
        return []
    m = SUMMARY_MARKER_RE.search(flatten_content(c))
    if not m:
        return []
    out = []
    for tok in m.group(1).split(","):
        tok = tok.strip()
        if tok.startswith("s") and tok[1:].isdigit():
            out.append(int(tok[1:]))
    return out
