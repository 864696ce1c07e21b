"""Exploration summaries: short, type-aware descriptions of very large messages.

A huge tool output or pasted file is stored verbatim, but the model is shown what
`explore` says about it: the detected kind, its size, and a kind-specific sketch (JSON
shape, YAML keys, CSV columns, code definitions with line numbers, log levels and
distinct errors, or the salient lines of prose).  `detect_kind` is the classifier.
Both are deterministic, bounded in time on multi-megabyte inputs, and never raise.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any, Callable, Iterable

__all__ = ["classify", "detect_kind", "explore"]

_SAMPLE = 65_536  # chars looked at to classify
_JSON_PARSE_LIMIT = 8_000_000  # json.loads is C-fast; beyond this, scan text instead
_JSON_SCAN = 262_144  # chars tokenised when the JSON cannot be parsed
_CSV_SAMPLE = 262_144
_MAX_DEFS = 2000
_LINE_CAP = 160  # chars shown of any one quoted line

_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_EXT_RE = re.compile(r"\.([A-Za-z0-9]{1,10})\s*$")
# extension -> kind; "code:" kinds name the language.
_EXT_KIND = {ext: kind for kind, exts in (
    ("json", "json jsonl ndjson geojson ipynb"), ("yaml", "yaml yml"), ("csv", "csv"),
    ("tsv", "tsv tab"), ("log", "log"), ("code:python", "py pyi"),
    ("code:javascript", "js mjs cjs jsx"), ("code:typescript", "ts tsx"), ("code:go", "go"),
    ("code:rust", "rs"), ("code:java", "java"), ("code:kotlin", "kt"), ("code:c", "c h"),
    ("code:cpp", "cc cpp cxx hpp"), ("code:shell", "sh bash zsh"), ("code:ruby", "rb"),
    ("code:php", "php"), ("code:sql", "sql"), ("code:html", "html htm"), ("code:css", "css"),
    ("code:csharp", "cs"),
) for ext in exts.split()}
_KIND_WORDS = {"json": "json", "yaml": "yaml", "csv": "csv", "tsv": "tsv", "log": "log", "logs": "log"}

# ---- classification signals ---------------------------------------------------------------

_TS_RE = re.compile(
    r"\s*[\[(]?(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d)?|\d\d/\w{3}/\d{4}:\d\d:\d\d|"
    r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d\d:\d\d:\d\d[.,]\d+|\d{10}(?:\.\d+)?\s)"
)
_LEVEL_RE = re.compile(r"\b(?:ERROR|WARN|WARNING|INFO|DEBUG|TRACE|FATAL|CRITICAL)\b|level=\w+")
# A literal every _LEVEL_RE match holds (keep the two in step): one scan of the lines tells
# that none can match, where _LEVEL_RE (a leading \b: tried at every position) costs per line.
_LEVEL_WORDS = re.compile(r"ERROR|WARN|INFO|DEBUG|TRACE|FATAL|CRITICAL|level=")
_LANG_SIGNS: dict[str, re.Pattern[str]] = {
    lang: re.compile(pat, re.MULTILINE) for lang, pat in {
        "python": r"^\s*(?:def \w+\(.*:\s*$|class \w+.*:\s*$|import \w|from [\w.]+ import |"
                  r"elif .*:$|except\b.*:$|if __name__)|\bself\.\w",
        "typescript": r"^\s*(?:export )?(?:interface|type|enum) \w+|:\s*(?:string|number|boolean)\b[;,)=]",
        "javascript": r"^\s*(?:function\*? \w+|const \w+ = |let \w+ = |var \w+ = |module\.exports|"
                      r"export (?:default|const|function|class)|import .+ from ['\"])|=> |require\(['\"]|console\.log",
        "go": r"^(?:package \w+$|func |import \($|type \w+ (?:struct|interface))|\s:= |\bfmt\.",
        "rust": r"^\s*(?:pub(?:\([^)]*\))? )?(?:fn|struct|enum|impl|trait|mod|use) |let mut |println!|#\[derive",
        "java": r"^\s*(?:(?:public|private|protected) (?:static )?(?:final )?[\w<>\[\]]+ \w+\(|"
                r"import java|package [\w.]+;$|@Override)|System\.out",
        "c": r"^#(?:include|define|ifdef|ifndef|endif)\b|\bint main\(|printf\(|->\w|std::",
        "shell": r"^(?:#!.*\b(?:ba|z|k|da)?sh\b|\s*(?:fi|then|do|done|esac)\s*$|\s*if \[|\s*echo |"
                 r"\s*export \w+=|\s*set -[euxo])",
        "ruby": r"^\s*(?:def \w+[?!]?(?:\(.*\))?$|end$|require ['\"]|module \w+$|attr_\w+ :)",
        "php": r"<\?php|\$this->|^\s*(?:public |private )?function \w+\(",
        "sql": r"(?i)^\s*(?:select .+ from|insert into|update \w+ set|create (?:table|index|view)|alter table)",
        "html": r"(?i)<!doctype html|<html|<head>|<body|<div[\s>]",
    }.items()
}
# Literals at least one of which every match of a language's pattern above contains: a
# sample holding none of them has no match, so its scan is skipped (the count is 0 either way).
# Keep each list in step with its pattern. (sql's and html's patterns ignore case: sql is
# always scanned, since case folding can match letters a lower-cased sample does not show;
# every html alternative holds a "<".)
_LANG_GATES: dict[str, tuple[str, ...]] = {
    "python": ("def ", "class ", "import ", "from ", "elif ", "except", "if __name__", "self."),
    "typescript": ("interface ", "type ", "enum ", "string", "number", "boolean"),
    "javascript": ("function", "const ", "let ", "var ", "module.exports", "export ", "import ", "=> ",
                   "require(", "console.log"),
    "go": ("package ", "func ", "import (", "type ", ":= ", "fmt."),
    "rust": ("fn ", "struct ", "enum ", "impl ", "trait ", "mod ", "use ", "let mut ", "println!", "#[derive"),
    "java": ("public ", "private ", "protected ", "import java", "package ", "@Override", "System.out"),
    "c": ("#include", "#define", "#ifdef", "#ifndef", "#endif", "int main(", "printf(", "std::"),  # (and "->\w": below)
    "shell": ("#!", "fi", "then", "do", "esac", "if [", "echo ", "export ", "set -"),
    "ruby": ("def ", "end", "require ", "module ", "attr_"),
    "php": ("<?php", "$this->", "function "),
    "html": ("<",),
}

# A gate no literal expresses: c's "->\w" (python's annotations hold "-> " and no c).
_LANG_GATE_RES: dict[str, re.Pattern[str]] = {"c": re.compile(r"->\w")}


def _lang_count(lang: str, sample: str) -> int:
    """`len(_LANG_SIGNS[lang].findall(sample))`, without the scan when no gate is present."""
    gates = _LANG_GATES.get(lang)
    if gates is not None and not any(g in sample for g in gates):
        extra = _LANG_GATE_RES.get(lang)
        if extra is None or not extra.search(sample):
            return 0
    return len(_LANG_SIGNS[lang].findall(sample))


_YAML_LINE_RE = re.compile(r"\s*(?:- +)?(?:[\w.\-/]+|\"[^\"]+\"|'[^']+')\s*:(?:\s|$)|\s*- |\s*#|---$|\.\.\.$")
_YAML_TOP_RE = re.compile(r"([A-Za-z_\"'][^:#]{0,80}?)\s*:(?:\s+(.*))?$")


def _clean(text: str) -> str:
    # Lone surrogates would break a later UTF-8 encode; control characters
    # (NUL included) confuse terminals and prompts.  Length is preserved.
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    return _CTRL_RE.sub("\ufffd", text)


def _short(text: str, limit: int = _LINE_CAP) -> str:
    # Cut before cleaning: a "line" can be a whole 5 MB blob.
    text = _clean(text[: limit * 8].strip().replace("\t", " "))
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _hint_kind(hint: str | None) -> str | None:
    if not hint or not isinstance(hint, str):
        return None
    h = hint.strip().lower()
    if h in _KIND_WORDS:
        return _KIND_WORDS[h]
    m = _EXT_RE.search(h)
    return _EXT_KIND.get(m.group(1)) if m else None


def _binaryish(sample: str) -> bool:
    if not sample:
        return False
    bad = len(_CTRL_RE.findall(sample[:8192]))
    return bad > 0.1 * min(len(sample), 8192)


def _nonempty_lines(sample: str, limit: int) -> list[str]:
    return [ln for ln in sample.split("\n", limit * 4)[: limit * 4] if ln.strip()][:limit]


def _looks_log(lines: list[str]) -> bool:
    stamps = [_TS_RE.match(ln) is not None for ln in lines]
    stamped = sum(stamps)
    if _LEVEL_WORDS.search("\n".join(lines)) is None:
        hits = stamped  # (no line holds a level word: _LEVEL_RE finds nothing in any)
    else:
        hits = sum(1 for ln, st in zip(lines, stamps) if st or _LEVEL_RE.search(ln))
    return (hits >= 3 and hits >= 0.4 * len(lines)) or (0 < len(lines) <= 2 and stamped == len(lines))


def _code_lang(sample: str, lines: list[str]) -> str | None:
    head = sample[:256]
    if head.startswith("#!"):
        first = head.split("\n", 1)[0]
        for word, lang in (("python", "python"), ("node", "javascript"), ("sh", "shell")):
            if word in first:
                return lang
    best, best_n = None, 0
    for lang in _LANG_SIGNS:
        n = _lang_count(lang, sample)
        if n > best_n:  # dict order breaks ties deterministically
            best, best_n = lang, n
    if best == "javascript" and _lang_count("typescript", sample) >= 2:
        best = "typescript"
    if best and best_n >= 3 and best_n >= 0.08 * max(1, len(lines)):
        return best
    return None


def _csv_delimiter(lines: list[str]) -> str | None:
    """The delimiter the first 40 lines share: the first line holds it, and at least 80 %
    of the lines (and `need` of them) hold it as many times. The lines are counted only for
    a delimiter the first line holds, and the prose test made only when it decides."""
    if len(lines) < 2:
        return None
    head = lines[:40]
    prose: bool | None = None
    for delim, need in (("\t", 2), (",", 3), (";", 3), ("|", 3)):
        first = head[0].count(delim)
        if first == 0 or len(head) < need:
            continue
        same = sum(1 for ln in head if ln.count(delim) == first)
        if same >= need and same >= 0.8 * len(head):
            if delim != "\t" and prose is None:
                # Prose has commas too, but its lines end like sentences.
                prose = sum(1 for ln in head if ln.rstrip()[-1:] in ".!?:") >= 0.5 * len(head)
            if not (prose and delim != "\t"):
                return delim
    return None


def _looks_yaml(lines: list[str]) -> bool:
    content = [ln for ln in lines if not ln.lstrip().startswith("#")]
    if not content:
        return False
    if content[0].strip() == "---" and len(content) > 1:
        return True
    if len(content) < 2:
        return False
    # 70 % of the lines key-like: the count stops once that cannot be reached.
    need, most = 0.7 * len(content), len(content)
    for ln in content:
        if not _YAML_LINE_RE.match(ln):
            most -= 1
            if most < need:
                return False
    top = sum(1 for ln in content if ln[:1] not in " \t-" and _YAML_TOP_RE.match(ln))
    return top >= 1 and (top >= 2 or len(content) >= 3)


def _parse_json(text: str) -> tuple[bool, Any, str]:
    """(parsed?, value, error).  Never raises; deep nesting is an error like any other."""
    if len(text) > _JSON_PARSE_LIMIT:
        return False, None, f"not parsed: larger than {_JSON_PARSE_LIMIT:,} chars"
    try:
        return True, json.loads(text), ""
    except (ValueError, RecursionError) as exc:
        return False, None, _short(str(exc), 120)
    except Exception as exc:  # pragma: no cover - json raises only the above in practice
        return False, None, _short(f"{type(exc).__name__}: {exc}", 120)


def _jsonl_records(text: str, limit: int = 50) -> list[Any] | None:
    recs: list[Any] = []
    for line in text.split("\n", limit * 2)[: limit * 2]:
        line = line.strip()
        if not line:
            continue
        if line[0] not in "{[":
            return None
        ok, val, _ = _parse_json(line) if len(line) < 1_000_000 else (False, None, "")
        if not ok:
            return None if len(recs) < 2 else recs
        recs.append(val)
        if len(recs) >= limit:
            break
    return recs if len(recs) >= 2 else None


def _classify(text: str, hint: str | None) -> tuple[str, Any]:
    """(kind, parsed JSON or None).  The JSON is parsed once, here."""
    sample = text[:_SAMPLE]
    stripped = sample.lstrip("\ufeff \t\r\n")
    if not stripped:
        return "text", None
    if _binaryish(sample):
        return "text", None
    hinted = _hint_kind(hint)
    lines = _nonempty_lines(sample, 200)
    if stripped[0] in "{[" and not (stripped[0] == "[" and _looks_log(lines[:20])):
        ok, val, err = _parse_json(text.strip())
        if ok:
            return "json", ("value", val)
        recs = _jsonl_records(stripped)
        if recs is not None:
            return "json", ("lines", recs)
        if hinted == "json" or re.match(r"[{\[]\s*(?:\"[^\"]*\"\s*:|[{\[\"\d-]|true|false|null|[\]}])", stripped):
            return "json", ("error", err)  # invalid or too big: described from a text scan
    if hinted and hinted != "json":
        return hinted, None
    if _looks_log(lines):
        return "log", None
    lang = _code_lang(sample, lines)
    if lang:
        return f"code:{lang}", None
    if _looks_yaml(lines):
        return "yaml", None
    delim = _csv_delimiter(lines)
    if delim:
        return ("tsv" if delim == "\t" else "csv"), None
    return "text", None


def classify(text: str, hint: str | None = None) -> tuple[str, Any]:
    """`detect_kind`'s kind with what `explore` needs besides (the parsed JSON), for a caller
    that wants both the kind and `explore(text, classified=...)` of the same text without
    classifying it twice. Never raises."""
    try:
        return _classify(text if isinstance(text, str) else str(text), hint)
    except Exception:  # pragma: no cover - classification must not fail
        return "text", None


def detect_kind(text: str, hint: str | None = None) -> str:
    """Classify `text` as "json", "yaml", "csv", "tsv", "code:<lang>", "log" or "text".

    `hint` (a tool or file name) settles ties: an extension such as ``.py`` or
    ``.yaml`` is trusted unless the content is clearly JSON.  Never raises.
    """
    return classify(text, hint)[0]


# ---- describers: each returns [(priority, line)] in display order; 0 is kept first --------

Lines = list[tuple[int, str]]


def _jtype(v: Any) -> str:
    return "null" if v is None else {dict: "object", list: "array", str: "string", int: "int", float: "float",
                                     bool: "bool"}.get(type(v), type(v).__name__)


def _jbrief(v: Any) -> str:
    if isinstance(v, dict):
        return f"object ({len(v):,} keys)"
    if isinstance(v, list):
        kinds = sorted({_jtype(x) for x in v[:50]})
        of = f" of {'|'.join(kinds)}" if kinds else ""
        return f"array[{len(v):,}]{of}"
    if isinstance(v, str):
        return f"string (len {len(v):,}) = {_short(json.dumps(v, ensure_ascii=False), 48)}"
    if v is None:
        return "null"
    try:
        return f"{_jtype(v)} = {_short(json.dumps(v), 40)}"
    except (ValueError, TypeError):  # pragma: no cover - huge ints
        return _jtype(v)


def _merged_keys(items: list[Any]) -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for it in items[:20]:
        if isinstance(it, dict):
            for k, v in it.items():
                keys.setdefault(str(k), v)
    return keys


def _json_shape(v: Any, depth: int, out: Lines, budget: list[int]) -> None:
    # Depth-first display order, priority by depth: shallow keys survive a
    # tight budget, deeper detail is dropped first.
    if depth > 3 or budget[0] <= 0:
        return
    indent = "  " * depth
    if isinstance(v, dict):
        items = list(v.items())
        cap = (40, 15, 10, 8)[depth]
        for k, sub in items[:cap]:
            budget[0] -= 1
            out.append((depth + 1, f"{indent}{_short(str(k), 60)}: {_jbrief(sub)}"))
            _json_shape(sub, depth + 1, out, budget)
        if len(items) > cap:
            out.append((depth + 1, f"{indent}\u2026 {len(items) - cap:,} more keys"))
    elif isinstance(v, list) and v:
        if any(isinstance(x, dict) for x in v[:20]):
            keys = _merged_keys(v)
            out.append((depth + 1, f"{indent}[items] keys: {', '.join(_short(k, 40) for k in list(keys)[:30])}"))
            _json_shape(keys, depth + 1, out, budget)
        elif isinstance(v[0], list):
            out.append((depth + 1, f"{indent}[0]: {_jbrief(v[0])}"))
            _json_shape(v[0], depth + 1, out, budget)
        else:
            samples = ", ".join(_short(json.dumps(x, ensure_ascii=False), 40) for x in v[:3])
            out.append((depth + 2, f"{indent}e.g. {samples}"))


def _describe_json(text: str, parsed: tuple[str, Any]) -> Lines:
    how, val = parsed
    if how == "lines":
        n = text.count("\n") + 1 - text.count("\n\n")  # ~records: blank lines aside
        out: Lines = [(0, f"JSON lines: ~{n:,} records; first record: {_jbrief(val[0])}")]
        keys = _merged_keys(val)
        if keys:
            out.append((1, f"record keys: {', '.join(_short(k, 40) for k in list(keys)[:40])}"))
        _json_shape(keys or val[0], 0, out, [300])
        return out
    if how == "value":
        out = [(0, f"top level: {_jbrief(val)}")]
        _json_shape(val, 0, out, [400])
        return out
    scanned = min(len(text), _JSON_SCAN)
    return [(0, f"JSON not parsed ({val}); shape from a scan of the first {scanned:,} chars")] + _json_scan(
        text[:_JSON_SCAN])


_JSON_TOKEN_RE = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')


def _json_scan(head: str) -> Lines:
    """Top-level keys (or the first item's keys) and item counts from a token scan."""
    depth, top, items, last_str = 0, "", 0, ""
    keys: list[str] = []
    for m in _JSON_TOKEN_RE.finditer(head):
        tok = m.group()
        if tok[0] == '"':
            last_str = tok[1:-1][:60]
            continue
        if tok in "{[":
            top = top or tok
            depth += 1
        elif tok in "}]":
            depth -= 1
            if top == "[" and depth == 1:
                top = "[+"  # the first item is complete: stop collecting its keys
        elif tok == ":" and last_str and len(keys) < 60 and last_str not in keys:
            if (top == "{" and depth == 1) or (top == "[" and depth == 2):
                keys.append(last_str)
        elif tok == "," and depth == 1:
            items += 1
        last_str = ""
    if top.startswith("["):
        out: Lines = [(0, f"top level: array, >= {items + 1:,} items in the scanned part")]
        if keys:
            out.append((1, "first item keys: " + ", ".join(_short(k, 40) for k in keys)))
    else:
        out = [(0, f"top level: object; keys seen: {len(keys)}")]
        out.extend((1, f"  {_short(k, 60)}") for k in keys)
    if depth > 0:
        out.append((2, f"(scan ended inside depth {depth})"))
    return out


def _describe_yaml(text: str) -> Lines:
    # One pass over the lines (capped): cheap enough for 5 MB, no parser needed.
    tops: list[list[Any]] = []  # [name, line_no, inline, child_keys, items, child_indent]
    kinds: dict[str, int] = {}
    docs, seen_content = 1, False
    for no, line in enumerate(text.split("\n", 200_000)[:200_000], 1):
        body = line.strip()
        if body == "---":
            docs += seen_content
            continue
        if not body or body[0] == "#" or body == "...":
            continue
        seen_content = True
        if line[0] not in " \t-":
            m = _YAML_TOP_RE.match(line)
            if m:
                name, inline = m.group(1).strip().strip("\"'"), (m.group(2) or "").strip()
                if name == "kind" and inline:
                    kinds[inline] = kinds.get(inline, 0) + 1
                if len(tops) < 200:
                    tops.append([name, no, inline, [], 0, None])
            continue
        if not tops or tops[-1][2]:
            continue
        top = tops[-1]
        indent = len(line) - len(line.lstrip())
        if top[5] is None:
            top[5] = indent
        if indent == top[5]:
            if body.startswith("- "):
                top[4] += 1
            else:
                m = _YAML_TOP_RE.match(body)
                if m and len(top[3]) < 12:
                    top[3].append(m.group(1).strip().strip("\"'"))
    more = "+" if len(tops) >= 200 else ""
    out: Lines = [(0, f"YAML: {docs} document{'s' if docs != 1 else ''}, {len(tops)}{more} top-level keys")]
    if kinds:
        out.append((0, "kinds: " + ", ".join(f"{k} x{v}" for k, v in kinds.items())))
    for name, no, inline, child, items, _ in tops:
        if inline:
            desc = _short(inline, 60)
        elif items:
            desc = f"list of {items} item{'s' if items != 1 else ''}"
        elif child:
            desc = "mapping {" + ", ".join(_short(c, 30) for c in child) + ("}" if len(child) < 12 else ", \u2026}")
        else:
            desc = "(empty)"
        out.append((1, f"  L{no} {_short(name, 60)}: {desc}"))
    return out


def _num(cell: str) -> float | None:
    try:
        return float(cell.replace(",", "")) if cell and len(cell) < 40 else None
    except ValueError:
        return None


def _describe_csv(text: str, kind: str) -> Lines:
    lines = _nonempty_lines(text[:_SAMPLE], 40)
    delim = _csv_delimiter(lines) or ("\t" if kind == "tsv" else ",")
    sample = text[:_CSV_SAMPLE]
    if len(text) > _CSV_SAMPLE:
        sample = sample[: sample.rfind("\n") + 1] or sample
    try:
        rows = [r for r in csv.reader(io.StringIO(sample, newline=""), delimiter=delim) if r]
    except csv.Error:
        rows = [ln.split(delim) for ln in sample.split("\n") if ln.strip()]
    if not rows:
        return [(0, "no rows")]
    first = rows[0]
    has_header = all(_num(c) is None for c in first) and len(set(first)) == len(first)
    header = [c.strip() for c in first] if has_header else [f"col{i + 1}" for i in range(len(first))]
    data = rows[1:] if has_header else rows
    total = text.count("\n") + (0 if text.endswith("\n") else 1) - (1 if has_header else 0)
    approx = "~" if any("\n" in c for r in rows[:200] for c in r) else ""
    name = "tab" if delim == "\t" else repr(delim)
    out: Lines = [(0, f"{kind.upper()}: delimiter {name}, {len(header)} columns, {approx}{max(total, 0):,} data rows"
                      + ("" if has_header else " (no header row)"))]
    cols = []
    for i, col in enumerate(header[:60]):
        cells = [r[i] for r in data[:2000] if i < len(r) and r[i].strip()]
        nums = [x for x in (_num(c) for c in cells) if x is not None]
        if cells and len(nums) >= 0.9 * len(cells):
            cols.append((1, f"  {_short(col, 40)}: number, {min(nums):g} .. {max(nums):g}"))
        else:
            cols.append((1, f"  {_short(col, 40)}: text" + (f", e.g. {_short(cells[0], 40)}" if cells else "")))
    out.append((0, "columns: " + ", ".join(_short(c, 30) for c in header[:60])))
    if len(data) < total:
        out.append((2, f"  (column stats from the first {min(len(data), 2000):,} rows)"))
    out.extend(cols)
    if data:
        out.append((1, "first row: " + _short(delim.join(data[0]))))
        tail = text.rstrip("\n").rsplit("\n", 1)[-1]
        if len(data) > 1 and tail.strip():
            out.append((2, "last row: " + _short(tail)))
    return out


_DEF_RES: dict[str, list[re.Pattern[str]]] = {
    lang: [re.compile(p, re.MULTILINE) for p in pats] for lang, pats in {
        "python": [r"^([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+(\w+)[^\n]*"],
        "javascript": [
            r"^([ \t]*)(?:export[ \t]+)?(?:default[ \t]+)?(?:async[ \t]+)?(function)\*?[ \t]+(\w+)[^\n]*",
            r"^([ \t]*)(?:export[ \t]+)?(?:default[ \t]+)?(?:abstract[ \t]+)?(class)[ \t]+(\w+)[^\n]*",
            r"^([ \t]*)(?:export[ \t]+)?(const|let|var)[ \t]+(\w+)[ \t]*=[ \t]*(?:async[ \t]*)?(?:function|\([^)\n]{0,200}\)[ \t]*=>|\w+[ \t]*=>)[^\n]*",
            r"^([ \t]*)(?:export[ \t]+)?(interface|type|enum)[ \t]+(\w+)[^\n]*",
            r"^([ \t]+)(?:(?:public|private|protected|static|async|get|set|readonly)[ \t]+)*()(?!(?:if|for|while|switch|catch|return|function)\b)(\w+)[ \t]*\([^)\n]{0,200}\)[ \t]*(?::[^{\n]{0,80})?\{[^\n]*",
        ],
        "go": [r"^()(func)[ \t]+(?:\([^)\n]*\)[ \t]*)?(\w+)[^\n]*", r"^()(type)[ \t]+(\w+)[ \t]+(?:struct|interface)[^\n]*"],
        "rust": [r"^([ \t]*)(?:pub(?:\([^)\n]*\))?[ \t]+)?(?:async[ \t]+)?(?:unsafe[ \t]+)?(fn|struct|enum|trait|impl|mod)[ \t]+(?:<[^>\n]*>[ \t]*)?([\w:]+)[^\n]*"],
        "java": [
            r"^([ \t]*)(?:(?:public|private|protected|static|final|abstract|sealed)[ \t]+)*(class|interface|enum|record)[ \t]+(\w+)[^\n]*",
            r"^([ \t]+)(?:(?:public|private|protected|static|final|synchronized|abstract|native)[ \t]+)+()[\w<>\[\], ?]{1,80}?[ \t]+(\w+)[ \t]*\([^\n]*",
        ],
        "c": [
            r"^()()(?:[A-Za-z_][\w \t\*&:<>,]{0,80}?[ \t\*&])(?!(?:if|for|while|switch|return|sizeof)\b)([A-Za-z_]\w*)[ \t]*\([^;{}()\n]{0,200}\)[ \t]*(?:const[ \t]*)?\{?[ \t]*$",
            r"^()(?:typedef[ \t]+)?(struct|class|enum|union)[ \t]+(\w+)[^;\n]*$", r"^()(#define)[ \t]+(\w+)[^\n]*",
        ],
        "shell": [r"^([ \t]*)(?:(function)[ \t]+)?([A-Za-z_][\w:-]*)[ \t]*\(\)[^\n]*", r"^([ \t]*)(function)[ \t]+([A-Za-z_][\w:-]*)[^\n]*"],
        "ruby": [r"^([ \t]*)(def|class|module)[ \t]+([\w.:?!]+)[^\n]*"],
        "php": [r"^([ \t]*)(?:(?:public|private|protected|static|abstract|final)[ \t]+)*(function|class|interface|trait)[ \t]+(\w+)[^\n]*"],
        "sql": [r"(?i)^()[ \t]*(create[ \t]+(?:or[ \t]+replace[ \t]+)?(?:table|view|index|function|procedure|trigger))[ \t]+(?:if[ \t]+not[ \t]+exists[ \t]+)?([\w.\"`]+)[^\n]*"],
    }.items()
}
for _alias, _base in (("typescript", "javascript"), ("kotlin", "java"), ("csharp", "java"), ("cpp", "c")):
    _DEF_RES[_alias] = _DEF_RES[_base]
_IMPORT_RES: dict[str, re.Pattern[str]] = {
    lang: re.compile(p, re.MULTILINE) for lang, p in {
        "python": r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import|import[ \t]+([\w.]+))",
        "javascript": r"^[ \t]*import[^\n]*?from[ \t]*['\"]([^'\"\n]+)['\"]|require\(['\"]([^'\"\n]+)['\"]\)",
        "go": r"^[ \t]*(?:import[ \t]+)?(?:\w+[ \t]+)?\"([\w./-]+)\"[ \t]*$",
        "rust": r"^[ \t]*(?:pub[ \t]+)?use[ \t]+([\w:]+)",
        "java": r"^import[ \t]+(?:static[ \t]+)?([\w.]+)",
        "c": r"^#include[ \t]*[<\"]([^>\"\n]+)",
        "shell": r"^[ \t]*(?:source|\.)[ \t]+(\S+)",
        "ruby": r"^[ \t]*require(?:_relative)?[ \t]+['\"]([^'\"\n]+)",
        "php": r"^[ \t]*(?:use[ \t]+([\w\\]+)|(?:require|include)(?:_once)?[ \t(]+['\"]([^'\"\n]+))",
    }.items()
}
for _alias, _base in (("typescript", "javascript"), ("kotlin", "java"), ("csharp", "java"), ("cpp", "c")):
    _IMPORT_RES[_alias] = _IMPORT_RES[_base]


def _describe_code(text: str, lang: str) -> Lines:
    defs: list[tuple[int, int, str]] = []  # (line, indent, source line)
    capped = False
    for rx in _DEF_RES.get(lang, []):
        # Each pattern keeps its first _MAX_DEFS hits, so the first _MAX_DEFS
        # of the merged, line-sorted list are exactly the first in the file.
        line_no, last, hits = 1, 0, 0
        for m in rx.finditer(text):
            if hits >= _MAX_DEFS:
                capped = True
                break
            line_no += text.count("\n", last, m.start())
            last = m.start()
            defs.append((line_no, len(m.group(1).expandtabs(4)), m.group(0)))
            hits += 1
    defs.sort()
    defs = [d for k, d in enumerate(defs) if k == 0 or d[0] != defs[k - 1][0]]  # one per line
    shown: Lines = []
    classes: list[tuple[int, str]] = []  # (indent, name): the enclosing Python classes
    for line_no, indent, src in defs[:_MAX_DEFS]:
        label = _short(src, 100)
        if lang == "python":
            while classes and classes[-1][0] >= indent:
                classes.pop()
            d = re.match(r"\s*(?:async\s+)?(def|class)\s+(\w+)", src)
            if d and d.group(1) == "class":
                classes.append((indent, d.group(2)))
            elif d and classes and indent > 0:
                label = _short(src.strip().replace(f"def {d.group(2)}", f"def {classes[-1][1]}.{d.group(2)}", 1), 100)
        shown.append((1 if indent == 0 else 2, f"  L{line_no} {label}"))
    imports: list[str] = []
    rx_imp = _IMPORT_RES.get(lang)
    if rx_imp is not None:
        for m in rx_imp.finditer(text):
            name = next((g for g in m.groups() if g), "")
            if name and name not in imports:
                imports.append(name)
                if len(imports) >= 200:
                    break
    more = "+" if capped or len(defs) > _MAX_DEFS else ""
    out: Lines = [(0, f"language: {lang}; {min(len(defs), _MAX_DEFS):,}{more} definitions, {len(imports)} imports")]
    if imports:
        out.append((1, "imports: " + _short(", ".join(imports), 400)))
    if shown:
        out.append((0, "definitions (line numbers):"))
        out.extend(shown)
    else:
        out.extend(_describe_text(text))
    return out


_LOG_TOKEN_RE = re.compile(
    r"FATAL|CRITICAL|SEVERE|ERROR|WARNING|WARN|INFO|DEBUG|TRACE|Traceback|Exception|Error:|error:|panic:|"
    r"level=error|level=warn|\[error\]|\[warn"
)
_LEVEL_OF = {"FATAL": "FATAL", "CRITICAL": "CRITICAL", "SEVERE": "ERROR", "ERROR": "ERROR", "WARNING": "WARN",
             "WARN": "WARN", "INFO": "INFO", "DEBUG": "DEBUG", "TRACE": "TRACE", "level=warn": "WARN",
             "[warn": "WARN"}
_NORM_RE = re.compile(r"0x[0-9a-fA-F]+|\d+|[0-9a-f]{8,}")


def _describe_log(text: str) -> Lines:
    levels: dict[str, int] = {}
    errors: dict[str, list[Any]] = {}  # normalised -> [first line no, count, example]
    line_no, last, line_end = 1, 0, -1
    n = len(text)
    for m in _LOG_TOKEN_RE.finditer(text):
        s = m.start()
        if s < line_end:
            continue  # one count per line
        tok = m.group()
        prev = text[s - 1] if s else " "
        if tok.isupper() and (prev.isalpha() or text[m.end():m.end() + 1].isalpha()):
            continue  # part of a longer word
        line_no += text.count("\n", last, s)
        last = s
        ls = text.rfind("\n", max(0, s - 4096), s) + 1
        le = text.find("\n", s, min(n, s + 4096))
        line_end = le if le >= 0 else min(n, s + 4096)
        level = _LEVEL_OF.get(tok, "ERROR")
        levels[level] = levels.get(level, 0) + 1
        if level in ("ERROR", "FATAL", "CRITICAL"):
            line = text[ls:line_end]
            key = _NORM_RE.sub("#", _TS_RE.sub("", line, count=1))[:200]
            if key in errors:
                errors[key][1] += 1
            elif len(errors) < 500:
                errors[key] = [line_no, 1, line]
    lines = text.split("\n", 60)
    head = [ln for ln in lines[:60] if ln.strip()][:3]
    tail = [ln for ln in text[-8192:].split("\n") if ln.strip()][-3:]
    out: Lines = []
    first_ts = next((m.group(0).strip(" [(") for ln in lines[:60] for m in [_TS_RE.match(ln)] if m), "")
    last_ts = next((m.group(0).strip(" [(") for ln in reversed(tail + text[-8192:].split("\n")[-60:])
                    for m in [_TS_RE.match(ln)] if m), "")
    if first_ts or last_ts:
        out.append((0, f"time range: {_short(first_ts, 40)} .. {_short(last_ts, 40)}"))
    order = ("FATAL", "CRITICAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE")
    if levels:
        out.append((0, "levels: " + ", ".join(f"{k} {levels[k]:,}" for k in order if k in levels)))
    if errors:
        out.append((0, f"distinct error lines: {len(errors):,}{'+' if len(errors) >= 500 else ''}"))
        for no, count, line in sorted(errors.values(), key=lambda e: e[0])[:200]:
            out.append((1, f"  L{no}{f' (x{count})' if count > 1 else ''} {_short(line)}"))
    out.append((2, "head:"))
    out.extend((2, "  " + _short(ln)) for ln in head)
    out.append((2, "tail:"))
    out.extend((2, "  " + _short(ln)) for ln in tail)
    return out


_SALIENT = (
    (re.compile(r"^#{1,6} "), 4),  # markdown headings: the outline
    (re.compile(r"(?:Error|Exception|Traceback|error:|failed|FAIL|fatal|panic)"), 4),
    (re.compile(r"/[\w.-]+/|\w\.(?:py|js|ts|go|rs|java|c|h|md|json|ya?ml|toml|sh|sql)\b"), 3),
    (re.compile(r"https?://"), 2),
    (re.compile(r"[A-Z][a-z0-9]+[A-Z]|[a-z0-9]_[a-z0-9]|\w\(\)"), 1),
    (re.compile(r"\d"), 1),
)
_HEADING, _ERROR, _PATHISH, _URL, _NAMEISH, _DIGIT = (rx.search for rx, _w in _SALIENT)


def _salient(line: str) -> bool:
    """Does `line` score 3 or more by _SALIENT (the sum of the weights of the patterns found
    in its first 400 characters)? A heading, an error word or a path (4, 4, 3) alone does;
    else only a URL (2) with a name or a digit (1 each) does."""
    return bool(_HEADING(line, 0, 400) or _ERROR(line, 0, 400) or _PATHISH(line, 0, 400)
                or (_URL(line, 0, 400) and (_NAMEISH(line, 0, 400) or _DIGIT(line, 0, 400))))


def _describe_text(text: str) -> Lines:
    out: Lines = []
    if _binaryish(text[:_SAMPLE]):
        bad = len(_CTRL_RE.findall(text[:_SAMPLE]))
        out.append((0, f"binary-like content: {bad * 100 // max(1, min(len(text), _SAMPLE))}% control characters"))
    lines = text.split("\n")
    idx = [i for i in range(len(lines)) if lines[i].strip()]
    head, tail = idx[:5], idx[-3:] if len(idx) > 8 else []
    middle = idx[5:-3] if len(idx) > 8 else []
    stride = max(1, len(middle) // 20_000)  # bounded work on huge texts
    # The 40 best lines scoring 3 or more; with 40 or fewer such lines, all of them, whatever
    # their scores: the scores are added up only when there are more.
    salient = [i for i in middle[::stride] if _salient(lines[i])]
    if len(salient) <= 40:
        picked = salient  # (in order: `middle` is)
    else:
        scored = [(-sum(w for rx, w in _SALIENT if rx.search(lines[i], 0, 400)), i) for i in salient]
        picked = sorted(i for _, i in sorted(scored)[:40])
    if head:
        out.append((0, "head:"))
        out.extend((0, f"  L{i + 1} {_short(lines[i])}") for i in head)
    if picked:
        out.append((1, "salient lines:"))
        out.extend((1 if k < 12 else 2, f"  L{i + 1} {_short(lines[i])}") for k, i in enumerate(picked))
    if tail:
        out.append((1, "tail:"))
        out.extend((1, f"  L{i + 1} {_short(lines[i])}") for i in tail)
    return out


def _fit(header: str, body: Iterable[tuple[int, str]], max_chars: int) -> str:
    """Header, then body lines by priority while they fit, shown in their original order."""
    items = list(body)
    room = max_chars - len(header)
    keep: set[int] = set()
    for prio in sorted({p for p, _ in items}):
        for k, (p, line) in enumerate(items):
            if p == prio and len(line) + 1 <= room:
                keep.add(k)
                room -= len(line) + 1
    shown = [items[k][1] for k in sorted(keep)]
    # A section label ("tail:") whose lines did not fit says nothing.
    shown = [ln for i, ln in enumerate(shown)
             if not (ln.endswith(":") and not ln.startswith(" "))
             or (i + 1 < len(shown) and shown[i + 1].startswith("  "))]
    text = "\n".join([header] + shown)
    return text if len(text) <= max_chars else text[: max(0, max_chars - 1)] + "\u2026"


_DESCRIBERS: dict[str, Callable[[str], Lines]] = {"yaml": _describe_yaml, "log": _describe_log}


def explore(text: str, max_tokens: int = 600, hint: str | None = None,
            classified: tuple[str, Any] | None = None) -> str:
    """Describe a large text in at most `max_tokens` tokens ((len+3)//4).

    Always states the detected kind and the size (chars, lines, estimated
    tokens), then a kind-specific sketch.  Deterministic; bounded work on
    multi-megabyte input; never raises.  `hint` is a tool or file name;
    `classified`, `classify(text, hint)` when the caller has it already.
    """
    try:
        budget = int(max_tokens) * 4
    except Exception:
        budget = 600 * 4
    if budget <= 0:
        return ""
    if not isinstance(text, str):
        try:
            text = "" if text is None else str(text)
        except Exception:
            text = ""
    n_lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    size = f"{len(text):,} chars, {n_lines:,} lines, ~{(len(text) + 3) // 4:,} tokens"
    hint_s = f" (hint: {_short(hint, 60)})" if isinstance(hint, str) and hint.strip() else ""
    kind, parsed = classified if classified is not None else classify(text, hint)
    header = f"[explore] kind: {kind}; {size}{hint_s}"
    try:
        if kind == "json":
            body = _describe_json(text, parsed or ("error", "not JSON per content"))
        elif kind in ("csv", "tsv"):
            body = _describe_csv(text, kind)
        elif kind.startswith("code:"):
            body = _describe_code(text, kind[5:])
        else:
            body = _DESCRIBERS.get(kind, _describe_text)(text)
    except Exception as exc:  # pragma: no cover - a describer bug must not lose the header
        body = [(0, f"(no details: {type(exc).__name__})")]
    try:
        return _clean(_fit(_clean(header), body, budget))
    except Exception:  # pragma: no cover
        return _clean(header)[:budget]
