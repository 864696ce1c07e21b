"""Message identity, provider views and text flattening.

On the released host (R19) messages have no ids and carry host-only keys that differ
between a live and a resumed session, so identity is a hash of what the provider sees.
Newer hosts stamp `message_uid`; then the uid is the identity and content is a version.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

PROVIDER_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
ROLES = ("system", "user", "assistant", "tool", "function", "developer")
_UID_RE = re.compile(r"^[0-9a-f]{32}$")
# A tuple, not a set: a hostile part may carry an unhashable "type" (a list), and `in` must not raise.
_MEDIA_TYPES = ("image", "image_url", "input_image", "input_audio", "audio", "file")

# A marker inside summary text that survives the host merging our summary into a
# neighbour of the same role: we recognise our summaries by it, never by a prefix.
SUMMARY_OPEN = '<lcm-summary nodes="'
SUMMARY_MARKER_RE = re.compile(r'<lcm-summary nodes="([0-9s,]*)"')


def clean_text(s: str) -> str:
    """Text safe for any store: lone surrogates replaced, NUL bytes dropped."""
    if not s:
        return s
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace").replace("\x00", "")


_clean = clean_text


def safe_json(obj: Any) -> str:
    """JSON that never raises: unknown objects become strings, surrogates survive."""
    return json.dumps(obj, ensure_ascii=True, sort_keys=False, default=repr)


def _normal_tool_calls(tcs: Any) -> Any:
    if not isinstance(tcs, list):
        return tcs
    out = []
    for tc in tcs:
        if isinstance(tc, Mapping):
            fn = tc.get("function") if isinstance(tc.get("function"), Mapping) else {}
            out.append([tc.get("id"), tc.get("type"), fn.get("name"), fn.get("arguments")])
        else:
            out.append(tc)
    return out


def content_ident(msg: Any) -> str:
    """32-hex identity of what the provider sees of a message.

    Plain string content (the common, large case) is hashed directly rather than through
    json.dumps of the whole message, which dominated ingestion time.
    """
    h = hashlib.blake2b(digest_size=16)
    if isinstance(msg, dict):
        content = msg.get("content")
        role = msg.get("role")
        # A live tool result carries `name`; the host's reload of the same row has only
        # `tool_name`, and it strips message text: neither may make it a new message.
        name = None if role == "tool" else msg.get("name")
        rest = [role, _normal_tool_calls(msg.get("tool_calls")), msg.get("tool_call_id"), name]
        if isinstance(content, str):
            h.update(b"s\x1f")
            h.update(content.strip().encode("utf-8", "surrogatepass"))
        else:
            h.update(b"j\x1f")
            h.update(json.dumps(content, ensure_ascii=True, sort_keys=True, default=repr).encode("ascii"))
        h.update(b"\x1e")
        h.update(json.dumps(rest, ensure_ascii=True, sort_keys=True, default=repr).encode("ascii"))
    else:
        h.update(b"?\x1f" + repr(msg).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


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


def tool_call_ids(msg: Any) -> list[str]:
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return []
    tcs = msg.get("tool_calls")
    if not isinstance(tcs, list):
        return []
    return [tc.get("id") for tc in tcs if isinstance(tc, Mapping) and isinstance(tc.get("id"), str)]


def provider_view(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The message as a provider should see it: persistence-only fields stripped."""
    out = {k: msg[k] for k in PROVIDER_KEYS if k in msg}
    for k in ("reasoning_content", "reasoning_details", "refusal"):
        if k in msg and msg[k] is not None:
            out[k] = msg[k]
    return out


def flatten_content(content: Any, limit: int | None = None) -> str:
    """Plain text of a content value; media parts become short references, never base64."""
    if content is None:
        return ""
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
            text = flatten_content(content.get("content")) if "content" in content else safe_json(content)
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
            if isinstance(tc, Mapping):
                fn = tc.get("function") if isinstance(tc.get("function"), Mapping) else {}
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
    m = SUMMARY_MARKER_RE.search(flatten_content(msg.get("content")))
    if not m:
        return []
    out = []
    for tok in m.group(1).split(","):
        tok = tok.strip()
        if tok.startswith("s") and tok[1:].isdigit():
            out.append(int(tok[1:]))
    return out
