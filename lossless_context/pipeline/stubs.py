"""Tier 0: old tool results shown as stubs before any summary is made.

Before a pass calls a model, each tool result outside the recent window (the newest N
results, or the newest T tokens of the context) is shown as a *stub*: the tool name and
arguments, the size, the head and tail lines, the error lines (all of them: an error is
never cut below its error lines), fact lines (paths, ids, numbers) and the type-aware
sketch of `explore`. The original stays verbatim in the store, one `lcm_expand` away.

A stub is made once and persisted as the message's representation (the store's
`set_representation`, the same column that holds a huge message's exploration summary),
so every later pass, `select_context` and the summariser see the very same text: the
provider's prompt cache keeps hitting, and leaves summarise what the model was shown.
A result whose stub would not pay (under 30% saved) is decided once too: the verdict is kept
in the same column while the message is not shown by a representation (`prepare_representations`,
read only with the policy it was made under), so no later pass — in this process or the next
`hermes chat -q` — makes that stub again. Whether a stub can pay is first checked on its
header alone (every stub starts with it), so most small results cost no stub at all.

Tool results in the protected head are old like any other once the conversation has moved
on: the "newest N results" rule does not keep them (the token window still does), so a large
result read at the start of a session does not stay verbatim in every context.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from collections.abc import Iterator, Mapping  # (isinstance against it: ~6x cheaper than typing's alias)
from typing import Any, Sequence

from .assemble import STUB_MARK, Slot, large_representation, pending_start, repair
from ..messages import content_ident
from ..records import MessageRecord
from ..tokens import estimate_message_tokens, estimate_messages_tokens, estimate_text_tokens


_LINE_CAP = 240  # chars shown of a head/tail/fact line
_ERROR_LINE_CAP = 2000  # an error line is kept whole up to this (then marked as cut)
_ERROR_RE = re.compile(
    r"Traceback \(most recent call last\)|(?:Error|Exception)[:(]|\berror[:\[]|\bERROR\b|\bFATAL\b|"
    r"\bfatal:|\bpanic:|\bFAILED\b|\bFAIL\b|\bfailed\b|exit (?:code|status) [1-9]|Segmentation fault|"
    r"\bERR_[A-Z0-9_]+")
# A literal each alternative of _ERROR_RE contains (keep the two in step).
_ERROR_WORDS = re.compile(r"Traceback|Error|Exception|error|ERROR|FATAL|fatal:|panic:|FAIL|failed|exit |"
                          r"Segmentation fault|ERR_")
_PATH_RE = re.compile(r"(?<![\w/.-])(?:\.{0,2}/)?(?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|js|ts|tsx|go|rs|java|c|h|cpp|"
                      r"md|json|ya?ml|toml|sh|sql|txt|cfg|ini|lock|html|css)\b")
# Ids: an upper-case name with "-"/"_" parts (LEDGER-4821, BUILD_ID), a hex hash of 7-40
# digits, a UUID; each starting at a word boundary. Written as "a first character, and no word
# character before it" (what \b means before a word character), then the rest of the form
# that character can start: a pattern that begins with a character set is searched by a
# fast scan to the next such character, one that begins with \b is tried at every position
# (a third less time; tests/test_stub_outputs_pinned.py checks the matches are the same).
_ID_RE = re.compile(r"[0-9A-Za-f](?<!\w[0-9A-Za-f])(?:(?<=[A-Z])[A-Z0-9]*(?:[-_][A-Z0-9]+)+\b|"
                    r"(?<=[0-9a-f])(?:[0-9a-f]{6,39}\b|[0-9a-f]{7}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b))")
_PATH_EXT_RE = re.compile(_PATH_RE.pattern.split("|", 1)[1])  # _PATH_RE's second form (the first needs a "/")
# A number of two digits or more, not glued to a word or a dot: _facts keeps those of 3+ digits.
# (It starts with the digit, so the scan jumps from digit to digit; the look-behind then
# checks the character before it.)
_NUM_RE = re.compile(r"\d(?<![\w.]\d)[\d,_.]*\d(?![\w.])")
_EXIT_KEYS = ("exit_code", "returncode", "return_code", "status_code")


@dataclass(frozen=True)
class StubPolicy:
    """What tier 0 keeps verbatim, and how big a stub may be."""

    enabled: bool = True
    keep_results: int = 6  # the newest N tool results stay verbatim
    keep_tokens: int = 8000  # ... and so does every tool result within the newest T tokens
    min_tokens: int = 60  # results smaller than this are never stubbed (a stub would not pay)
    stub_tokens: int = 250  # size of a stub (error lines may exceed it: they are never cut)
    head_lines: int = 2
    tail_lines: int = 2
    redact: bool = True  # secrets out of the stub (it stands in the model's context like a summary)


    def key(self) -> str:
        """What a kept verdict depends on (a changed setting decides again)."""
        return f"v1.{self.stub_tokens}.{self.head_lines}.{self.tail_lines}.{int(self.redact)}"


# Kept verdicts, stored with a message no representation shows (never shown themselves):
# "<DECLINED> <policy key>]" — a stub would not pay; "<PREPARED> <policy key>]\n<stub>" — the
# stub, made when the result was stored (stub_prep.py), shown once the result is old.
DECLINED = "[lcm: no tool-output stub"
PREPARED = "[lcm: prepared tool-output stub"


def declined_mark(policy: StubPolicy) -> str:
    return f"{DECLINED} {policy.key()}]"


def prepared_text(policy: StubPolicy, stub: str | None) -> str:
    """The kept verdict for `stub_for`'s answer (None: not worth a stub)."""
    return declined_mark(policy) if stub is None else f"{PREPARED} {policy.key()}]\n{stub}"


def _kept_verdict(note: str, policy: StubPolicy) -> tuple[bool, str | None]:
    """(known, stub) of a kept verdict made under `policy`; (False, None) for anything else
    (none, another policy's)."""
    if note == declined_mark(policy):
        return True, None
    head = f"{PREPARED} {policy.key()}]\n"
    if note.startswith(head):
        return True, note[len(head):]
    return False, None


def stub_policy(cfg: Any) -> StubPolicy:
    """The policy an LCMConfig asks for."""
    return StubPolicy(bool(cfg.tool_stubs), int(cfg.tool_stub_keep_results), int(cfg.tool_stub_keep_tokens),
                      int(cfg.tool_stub_min_tokens), int(cfg.tool_stub_tokens), redact=bool(cfg.redact))


# -- making one stub ------------------------------------------------------------------------


def _body_text(content: str) -> tuple[str, list[str]]:
    """The text whose lines are shown, and extra fact lines (a JSON result's exit code and
    error fields): a tool that wraps its output in JSON has the lines in one string field."""
    facts: list[str] = []
    stripped = content.lstrip()
    if not stripped.startswith("{") or len(content) > 4_000_000:
        return content, facts
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return content, facts
    if not isinstance(data, dict):
        return content, facts
    for k in _EXIT_KEYS:
        v = data.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            facts.append(f"{k}: {v}")
    for k in ("error", "stderr"):
        v = data.get(k)
        if isinstance(v, str) and v.strip():
            facts.extend(f"{k}: {ln}" for ln in v.strip().splitlines()[:50])
    strings = [(len(v), k, v) for k, v in data.items() if isinstance(v, str)]
    if strings:
        _, key, longest = max(strings)
        if longest.count("\n") >= 2 or len(longest) > len(content) // 2:
            return longest, facts
    return content, facts


def _cap(line: str, limit: int = _LINE_CAP) -> str:
    line = line.rstrip()
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


def error_lines(lines: Sequence[str]) -> list[tuple[int, str]]:
    """(line number, line) of every error line; a Python traceback is kept whole (its frames
    up to the exception line), because the frames are what the agent needs to act on it."""
    # One scan for the literal words every error pattern contains (a scan of _ERROR_RE itself,
    # whose alternatives start with look-arounds, tries every position: 25x slower), then
    # _ERROR_RE on the lines holding one. No error pattern spans a line, so the lines found
    # are the lines _ERROR_RE matches in the joined text.
    # (A line's index is the count of line breaks before its words: no line holds one.)
    capped = max(map(len, lines), default=0) > 4000
    text = "\n".join(ln[:4000] for ln in lines) if capped else "\n".join(lines)
    near_set: set[int] = set()
    line_no, last = 0, 0
    for m in _ERROR_WORDS.finditer(text):
        line_no += text.count("\n", last, m.start())
        last = m.start()
        near_set.add(line_no)
    near = sorted(near_set)
    hits = [i for i in near if _ERROR_RE.search(lines[i][:4000])]
    out: list[tuple[int, str]] = []
    n, done = len(lines), -1
    for i in hits:
        if i <= done:
            continue
        line = lines[i]
        if "Traceback (most recent call last)" in line:
            j = i + 1
            while j < n and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                j += 1
            end = min(n, j + 1)  # the exception line itself
            out.extend((k + 1, _cap(lines[k], _ERROR_LINE_CAP)) for k in range(i, end) if lines[k].strip())
            done = end - 1
            continue
        out.append((i + 1, _cap(line, _ERROR_LINE_CAP)))
        done = i
    return out


def path_matches(text: str, rx: re.Pattern[str]) -> Iterator[str]:
    r"""`m.group(0) for m in rx.finditer(text)` for `rx` one of the two path patterns, scanning
    only the whitespace-separated words that hold a "/" or a "." (a third of the time).

    The same matches in the same order: a path match is made of `[\w/.-]` characters only, so
    it lies inside one word; its first form needs a "/", the second a "."; and a word's edges
    are text edges or whitespace, which neither pattern's look-behind nor its `\b` tells apart
    (whitespace is never `\w`, "/", "." or "-"). tests/test_stub_outputs_pinned.py checks it."""
    for word in text.split():
        if "/" in word or "." in word:
            for m in rx.finditer(word):
                yield m.group(0)


def _facts(text: str, budget_chars: int, code: bool = False) -> list[str]:
    """Distinct paths, ids and numbers of the text, in order of first appearance, bounded.
    Numbers of fewer than three digits (line numbers, counters) are left out; so are all
    numbers of source code, where they are mostly line numbers and constants."""
    sample = text if len(text) <= 400_000 else text[:200_000] + "\n" + text[-200_000:]
    out: list[str] = []
    paths = _PATH_RE if "/" in sample else _PATH_EXT_RE
    # A fact line is cut at `cap` characters: once the values found make it longer than
    # that, more values change nothing it shows (they are appended; its first cap-1
    # characters stay, and it ends in a value, which holds no whitespace for _cap's rstrip),
    # so the scan stops there. A stub's budget leaves room for a few values: the scan reads
    # a fraction of the text. (tests/test_stub_outputs_pinned.py checks it against the full scan.)
    cap = max(60, budget_chars // 3)
    for label, rx, limit in (("paths", paths, 16), ("ids", _ID_RE, 16), ("numbers", _NUM_RE, 16)):
        if label == "numbers" and code:
            continue
        seen: dict[str, None] = {}
        shown: list[str] = []
        size = len(label)  # len(f"{label}: " + ", ".join(shown))
        found = path_matches(sample, rx) if label == "paths" else (m.group(0) for m in rx.finditer(sample))
        for v in found:
            v = v.strip(".,")
            # (a number is digits and ",_." separators: its digits are the rest)
            if label == "numbers" and len(v) - v.count(",") - v.count("_") - v.count(".") < 3:
                continue
            if len(v) < 2:
                continue
            if v not in seen:
                seen[v] = None
                shown.append(_cap(v, 120))
                size += 2 + len(shown[-1])
                if len(seen) >= limit or size > cap:
                    break
        if seen:
            out.append(_cap(f"{label}: " + ", ".join(shown), cap))
    return out


def _nonempty_ends(lines: Sequence[str], n: int, last: bool) -> list[tuple[int, str]]:
    """(line number, line) of the first (or last) `n` non-blank lines, in order: the head and
    tail of `[(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]` without the list of
    them all (a stub shows two of each end)."""
    out: list[tuple[int, str]] = []
    if n <= 0:
        return out
    order = range(len(lines) - 1, -1, -1) if last else range(len(lines))
    for i in order:
        if lines[i].strip():
            out.append((i + 1, lines[i]))
            if len(out) >= n:
                break
    if last:
        out.reverse()
    return out


def _call_text(call: tuple[str, str] | None) -> str:
    if call is None:
        return "tool: (unknown call)"
    name, args = call
    args = " ".join(args.split())
    return f"tool: {name}({_cap(args, 160)})"


_LINE_NO_RE = re.compile(r"^\s*L\d+\s+")


def _line_key(line: str) -> str:
    """What a line shows of its source line (without an "L12 " prefix): lines with equal
    keys show the same source line."""
    return _LINE_NO_RE.sub("", line).strip()


def _header(call: tuple[str, str] | None, kind: str, chars: int, n_lines: int | None, tokens: int,
            error: bool) -> str:
    lines = "" if n_lines is None else f"{n_lines:,}"
    return (f"{STUB_MARK} {_call_text(call)} · {kind}, {chars:,} chars, {lines} lines, "
            f"~{tokens:,} tokens{' · ERROR' if error else ''}")


def header_floor(content: str, call: tuple[str, str] | None, tokens: int) -> str:
    """The part of `make_stub(content, call, …, tokens)`'s text known without reading the
    content (its header minus the kind, line count and error flag): every stub of it holds
    these characters in this order, so its size is a floor of the stub's."""
    return _header(call, "", len(content), None, tokens, False)


def make_stub(content: str, call: tuple[str, str] | None, policy: StubPolicy, tokens: int | None = None) -> str:
    """The stub of one tool result (deterministic: same input, same text).

    Its size is `policy.stub_tokens` at most and a quarter of the original for a small one,
    except that error lines are never cut: an error result keeps every error line.
    """
    body, json_facts = _body_text(content)
    lines = body.split("\n")
    n_lines = len(lines) - (1 if body.endswith("\n") else 0)
    hint = _path_hint(call)
    from ..text.explore import classify, detect_kind, explore  # (first stub: keeps the plugin's load light)

    # The kind is read from the first 8 KB; a body no longer than that is classified once for
    # the header and the sketch both (the classification parses JSON: half a stub's cost).
    classified = classify(body, hint) if len(body) <= 8192 else None
    kind = classified[0] if classified is not None else detect_kind(body[:8192], hint)
    code = kind.startswith("code:")
    errs = [] if code else error_lines(lines)  # in source code, "raise ValueError" is no error
    orig_tokens = tokens if tokens is not None else estimate_text_tokens(content)
    budget = min(policy.stub_tokens, max(32, orig_tokens // 4)) * 4
    header = _header(call, kind, len(content), n_lines, orig_tokens, bool(errs or _failed(json_facts)))
    parts = [header]
    if json_facts:
        parts.extend(_cap(f, _ERROR_LINE_CAP) for f in json_facts)
    if errs:
        # Never cut: all error lines, whatever the budget (a stub that hides an error misleads).
        parts.append(f"error lines ({len(errs)}):")
        parts.extend(f"  L{no} {ln}" for no, ln in errs)
    room = budget - sum(len(p) + 1 for p in parts)
    head = _nonempty_ends(lines, policy.head_lines, False)
    tail = [x for x in _nonempty_ends(lines, policy.tail_lines, True) if x not in head]
    err_nos = {no for no, _ in errs}
    optional: list[str] = []
    optional.extend(_facts(body, max(120, room // 2), code))
    if head:
        optional.append("head:")
        optional.extend(f"  L{no} {_cap(ln)}" for no, ln in head if no not in err_nos)
    if tail:
        optional.append("tail:")
        optional.extend(f"  L{no} {_cap(ln)}" for no, ln in tail if no not in err_nos)
    for line in optional:
        if line.endswith(":") and not line.startswith(" "):
            if len(line) + 1 + 40 > room:
                continue  # a section label without room for a line says nothing
        elif len(line) + 1 > room:
            continue
        parts.append(line)
        room -= len(line) + 1
    if parts[-1] in ("head:", "tail:"):
        parts.pop()
    if room > 240:
        # The type-aware sketch (JSON shape, code definitions, log levels…), minus what we have.
        sketch = explore(body, max_tokens=max(50, room // 4), hint=hint, classified=classified)
        shown = {_line_key(p) for p in parts}  # (a set: each sketch line is looked up once)
        for line in sketch.split("\n")[1:]:
            if not line.strip() or line.endswith(":"):
                continue
            key = _line_key(line)
            if key in shown:
                continue
            if len(line) + 1 > room:
                break
            parts.append(line)
            shown.add(key)
            room -= len(line) + 1
    return "\n".join(parts)


def _failed(json_facts: Sequence[str]) -> bool:
    return any(f.startswith(("error:", "stderr:")) or (f.split(": ", 1)[-1] not in ("0", "0.0", "200")
                                                        and f.startswith(_EXIT_KEYS)) for f in json_facts)


def _path_hint(call: tuple[str, str] | None) -> str | None:
    """A file name from the call's arguments (what `explore` classifies by), else the tool name."""
    if call is None:
        return None
    name, args = call
    try:
        data = json.loads(args)
    except (ValueError, TypeError, RecursionError):
        data = None
    if isinstance(data, dict):
        for k in ("path", "file_path", "filename", "file"):
            v = data.get(k)
            if isinstance(v, str) and v:
                return v
    return name


def is_stub(exploration: str | None) -> bool:
    return isinstance(exploration, str) and exploration.startswith(STUB_MARK)


# -- choosing what to stub --------------------------------------------------------------------


def calls_by_id(slots: Sequence[Slot]) -> dict[str, tuple[str, str]]:
    """(tool name, arguments) of every tool call the slots' assistant messages make, by call id."""
    out: dict[str, tuple[str, str]] = {}
    for s in slots:
        msg = s.msg
        if s.kind != "m" or not s.call_ids or not isinstance(msg, Mapping):
            continue
        for tc in msg.get("tool_calls") or ():
            if not isinstance(tc, Mapping) or not isinstance(tc.get("id"), str):
                continue
            fn = f if isinstance(f := tc.get("function"), Mapping) else {}
            args = fn.get("arguments")
            if not isinstance(args, str):
                try:
                    args = json.dumps(args, ensure_ascii=False, sort_keys=True)
                except (TypeError, ValueError):
                    args = str(args)
            out[tc["id"]] = (str(fn.get("name") or "?"), args)
    return out


def candidates(slots: Sequence[Slot], policy: StubPolicy, start: int = 0, head_end: int = 0) -> list[int]:
    """Indexes of tool-result slots (from `start`) old enough to be stubbed: outside the
    newest `keep_results` results and the newest `keep_tokens` tokens, and big enough.
    Slots before `head_end` (the protected head) are kept by the token window only: the
    newest-results rule keeps a session's recent work in view, and a head result is the
    oldest output of the conversation however few results came after it."""
    out: list[int] = []
    results = used = 0
    for i in range(len(slots) - 1, start - 1, -1):
        s = slots[i]
        if s.kind != "m":
            used += s.tokens
            continue
        recent = used < policy.keep_tokens or (results < policy.keep_results and i >= head_end)
        used += s.tokens
        if s.role != "tool":
            continue
        results += 1
        if not recent and (s.text_tokens or s.tokens) >= policy.min_tokens:
            out.append(i)
    out.reverse()
    return out


def _pays(rep_tokens: int, tokens: int) -> bool:
    """Does a representation of `rep_tokens` save at least 30% of the original's `tokens`?"""
    return rep_tokens * 10 <= tokens * 7


def _make_redacted(text: str, call: tuple[str, str] | None, policy: StubPolicy, tokens: int) -> str:
    stub = make_stub(text, call, policy, tokens)
    if policy.redact:
        from ..text.redact import redact  # (first stub: keeps the plugin's load light)

        stub = redact(stub)  # its fact lines keep `KEY=value` lines whole: never a secret's value
    return stub


# The same output met again (a file read twice, a test run repeated: a fifth of the results of
# a generated coding session) gets the stub made the first time: the stub is a function of
# the text, the call, the policy and the size alone. Texts up to _CACHED_TEXT characters are
# kept as keys, so the cache holds at most a few MB.
_CACHED_TEXT = 16_384
_stub_text = functools.lru_cache(maxsize=256)(_make_redacted)


def forget_cached_stubs() -> None:
    """Empty this process's cache of stub texts (a test that counts the stubs made)."""
    _stub_text.cache_clear()


def stub_for(rec: MessageRecord, msg: Mapping[str, Any], call: tuple[str, str] | None,
             policy: StubPolicy) -> str | None:
    """The stub `rec` is shown by (redacted when the policy says so), or None when a stub
    would save under 30% of it. Decided on the header alone when that already rules it out."""
    content = rec.raw.get("content") if isinstance(rec.raw, Mapping) else None
    text = content if isinstance(content, str) else rec.text
    if not _pays(estimate_message_tokens(large_representation(msg, rec.id, rec.tokens,
                                                              header_floor(text, call, rec.tokens))), rec.tokens):
        return None  # (the floor's representation is never larger than the stub's)
    stub = _stub_text(text, call, policy, rec.tokens) if len(text) <= _CACHED_TEXT else \
        _make_redacted(text, call, policy, rec.tokens)
    if not _pays(estimate_message_tokens(large_representation(msg, rec.id, rec.tokens, stub)), rec.tokens):
        return None  # would save under 30%: not worth hiding the original
    return stub


def apply_stubs(store: Any, slots: list[Slot], records: dict[int, MessageRecord], policy: StubPolicy,
                start: int = 0, head_end: int = 0) -> int:
    """Stub the old tool results of `slots` in place (and persist each new stub once).

    Returns how many slots are shown as stubs now. A result already shown by a
    representation (a huge message, or a stub of an earlier pass) keeps it unchanged, and
    one an earlier pass found not worth a stub (a kept verdict of this policy) is not
    looked at again; a stub not clearly smaller than its original is not made.
    """
    if not policy.enabled:
        return 0
    calls: dict[str, tuple[str, str]] | None = None
    made: list[tuple[int, str]] = []
    mark = declined_mark(policy)
    declined: list[tuple[int, str]] = []
    shown = 0
    for i in candidates(slots, policy, start, head_end):
        s = slots[i]
        rec = records.get(s.refs[0])
        if rec is None or s.msg is None or rec.role != "tool":
            continue
        if rec.large and rec.exploration:
            continue  # already represented (compaction shows it)
        known, stub = _kept_verdict(rec.exploration, policy) if rec.exploration else (False, None)
        if not known:
            if calls is None:
                calls = calls_by_id(slots)
            stub = stub_for(rec, s.msg, calls.get(s.result_for or ""), policy)
            if stub is None:
                declined.append((rec.id, mark))
                rec.exploration = mark
        if stub is not None:
            made.append((rec.id, stub))
    if declined:
        store.prepare_representations(declined)
    if made:
        applied = store.set_representations(made)
        for mid, stub in made:
            rec = records[mid]
            if mid in applied:
                rec.large, rec.exploration = True, stub
            else:  # another pass stubbed it first: use what the store holds
                fresh = store.get_messages([mid]).get(mid)
                if fresh is not None:
                    records[mid] = fresh
    for i in range(start, len(slots)):
        s = slots[i]
        if s.kind == "m" and s.role == "tool":
            rec = records.get(s.refs[0])
            if rec is not None and rec.large and is_stub(rec.exploration):
                shown += 1
    return shown


def swap_stubs(host: list[Any], originals: Sequence[Any], slots: Sequence[Slot],
               store: Any = None) -> list[dict[str, Any]] | None:
    """The host's own list with only the messages whose slot is now shown differently (a
    stub) replaced; every other message, our summary block included, byte for byte as the
    host holds it, then made valid (`repair`). None when nothing changed. A message that
    had to be repaired (an assistant whose calls are not answered yet) is recorded as an
    alias of its stored original, so it is recognised when the host sends it back."""
    swap = {id(o): s.msg for o, s in zip(originals, slots) if o is not None and s.msg is not o}
    if not swap:
        return None
    changes: list[tuple[dict, dict]] = []
    # (a call the list ends waiting for stays as it is: its results come next, as in a full pass)
    out = repair([swap.get(id(m), m) for m in host], changes, pending_end=pending_start(slots) is not None)
    if len(out) != len(host):
        return None  # repair had to hold messages back: a full pass covers them by a leaf
    if changes and store is not None:
        by_obj = {id(o): s.refs[0] for o, s in zip(originals, slots) if o is not None and s.kind == "m"}
        by_obj.update({id(s.msg): s.refs[0] for s in slots if s.kind == "m" and s.msg is not None})
        store.add_aliases([(content_ident(new), by_obj[id(orig)]) for orig, new in changes if id(orig) in by_obj])
    return out


PRUNE_MIN_RECLAIM = 2000  # tokens a host-triggered prune must save (each commit breaks the prompt cache)


def prune(store: Any, slots: list[Slot], host: list[Any], policy: StubPolicy,
          head_end: int = 0) -> tuple[list[Any], int]:
    """The host's `prune_tool_results_only`: tier 0 alone, no model call. Returns the host's
    list itself and 0 unless new stubs save at least PRUNE_MIN_RECLAIM tokens. `head_end`:
    the end of the protected head (candidates())."""
    if not policy.enabled:
        return host, 0
    slots = [copy.copy(s) for s in slots]  # (the engine may keep the ingest's slots for its next call)
    records = store.get_messages([s.refs[0] for s in slots if s.kind == "m"])
    originals = [s.msg for s in slots]
    apply_stubs(store, slots, records, policy, head_end=head_end)
    n = 0
    for s, original in zip(slots, originals):
        rec = records.get(s.refs[0]) if s.kind == "m" else None
        if rec is not None and rec.large and rec.exploration and s.msg is not None:
            rep = large_representation(s.msg, rec.id, rec.tokens, rec.exploration)
            if rep.get("content") != s.msg.get("content"):
                # The host commits this list as its own rows: every key it keeps on the row
                # (`_db_persisted`, `message_uid`, `_tool_call_uid`, its timestamp …) stays, only
                # the content changes (as the host's own prune does); without them it would
                # write the row to its session database a second time.
                s.msg = {**original, **rep} if isinstance(original, dict) else rep
                n += 1
    out = swap_stubs(host, originals, slots, store)
    if out is None or estimate_messages_tokens(host) - estimate_messages_tokens(out) < PRUNE_MIN_RECLAIM:
        return host, 0
    return out, n
