"""Frozen copies of the original (slow) identity/token/JSON/text functions.

The fast versions in lossless_context must give byte-identical results: idents and token
counts are stored, and a changed ident would make the engine store every known message
again. Never "fix" these copies; they are the reference.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

IMAGE_TOKEN_COST = 1500
_IMAGE_TYPES = ("image", "image_url", "input_image")


def safe_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=True, sort_keys=False, default=repr)


def clean_text(s: str) -> str:
    if not s:
        return s
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace").replace("\x00", "")


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
    h = hashlib.blake2b(digest_size=16)
    if isinstance(msg, dict):
        content = msg.get("content")
        role = msg.get("role")
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


def _shadow(msg: Mapping[str, Any]) -> tuple[dict, int]:
    shadow: dict[str, Any] = {}
    images = 0
    for k, v in msg.items():
        if k.startswith("_"):
            continue
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


def estimate_message_tokens(msg: Any) -> int:
    if not isinstance(msg, dict):
        return (len(str(msg)) + 3) // 4 if str(msg) else 0
    shadow, images = _shadow(msg)
    return (len(str(shadow)) + 3) // 4 + images * IMAGE_TOKEN_COST
