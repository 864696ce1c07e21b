"""The built-in extractive summariser: deterministic, offline, always within budget.

It is the default when no model is configured and the last level of escalation, so it
must never fail: `extractive_summary` keeps the lines a coding agent needs later
(decisions, open tasks, errors, identifiers, paths, URLs, numbers, the user's requests,
where the work stands) and cites each with its source id so it can be expanded again.
Also home of `Source`, the unit every summariser takes as input.
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

from ..records import Source  # (defined with the other records; re-exported here)
from ..tokens import estimate_text_tokens

__all__ = ["Source", "extractive_summary"]


_ROLE_SHORT = {"user": "u", "assistant": "a", "tool": "t", "system": "sys", "summary": "s"}
_MAX_UNIT = 280  # chars of one kept line; longer lines are split into sentences/chunks
_MAX_UNIT_AGGRESSIVE = 140
_SEP = " \u2026 "  # between kept lines of one source: " … " marks the omission
# A source with more lines than this is sampled: head, tail, and the lines a
# whole-text scan flags as strong (errors, decisions, tasks, focus terms).
_MAX_UNITS_PER_SOURCE = 1500
_HEAD_TAIL_UNITS = 150
_CLIP_SCORE = 5  # lines scoring this much are kept clipped rather than dropped
_MIN_CLIP = 40  # ...if at least this many characters of them fit

_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_WS_RE = re.compile(r"[ \t\u00a0]+")
_SENTENCE_RE = re.compile(r"(?<=[.!?;])\s+")
_HAS_WORD_RE = re.compile(r"[A-Za-z0-9]")
_DIGITS_RE = re.compile(r"\d+")

# Keyword signals: the words of a lower-cased line are looked up in sets, and
# the few multi-word phrases with `in`.  (A regex alternation of keywords
# costs ~10 us per line; these lookups cost well under 1 us.)
_WORD_RE = re.compile(r"[a-z_']+")
_DECISION_WORDS = frozenset(
    "decided decide decision agreed agree chose settled conclusion resolved because instead "
    "approach".split())
_DECISION_PHRASES = ("let's ", "lets use", "going with", "go with", "the plan", "plan:", "we should",
                     "switch to", "switched to", "will use", "fixed by", "root cause", "turns out",
                     "fixed it", "fixed this")
_TASK_WORDS = frozenset(
    "todo fixme xxx remaining pending blocked must followup follow-up".split())
_TASK_PHRASES = ("next step", "still need", "still to do", "still fail", "still broken", "need to",
                 "needs to", "open question", "follow up", "not yet", "left to do", "action item")
_ERROR_WORDS = frozenset(
    "traceback error errors failed failure failures fails fatal panic exception segfault "
    "denied refused timeout timedout invalid unable cannot can't".split())
_ERROR_PHRASES = ("timed out", "not found", "exit code", "exit status")
# word -> category ("d"ecision, "t"ask, "e"rror); phrases are only tested when
# their first word occurs in the line.
_WORD_CAT = {w: c for c, ws in (("d", _DECISION_WORDS), ("t", _TASK_WORDS), ("e", _ERROR_WORDS))
             for w in ws}
_PHRASE_CAT = {p: c for c, ps in (("d", _DECISION_PHRASES), ("t", _TASK_PHRASES), ("e", _ERROR_PHRASES))
               for p in ps}
_PHRASES_BY_WORD: dict[str, list[str]] = {}
for _phrase in _PHRASE_CAT:
    _PHRASES_BY_WORD.setdefault(_WORD_RE.findall(_phrase)[0], []).append(_phrase)
_HTTP_GATE = ("http/", "status", "return", "respon", "code", "not found", "bad ", "unauthorized",
              "forbidden", "server error", "unavailable", "timeout", "too many", "conflict")
_ERROR_TOKENS = ("Error", "Exception", "ERR_", "_ERROR", "_FAILED", "_TIMEOUT", "FAIL", "FATAL")
_ERRNO_RE = re.compile(r"E(?:NOENT|ACCES|PERM|CONNREFUSED|CONNRESET|TIMEDOUT|ADDRINUSE|PIPE|EXIST|NOTDIR|ISDIR)")
_EXC_LINE_RE = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:?")
# Each pattern starts with a literal or a character class so the regex engine
# can skip ahead to candidates; a leading \b forces an attempt at every position.
_HTTP_RE = re.compile(  # on the lower-cased line
    r"(?:http/\d(?:\.\d)?|status(?:[ _]?code)?|returned|response|code)\W{0,3}[1-5]\d\d\b"
    r"|[45]\d\d (?:not found|bad request|unauthorized|forbidden|internal server error|"
    r"bad gateway|service unavailable|gateway timeout|too many requests|conflict)"
)
_FRAME_RE = re.compile(r"\s*(?:File \"|at [\w.$<>]+\(|#\d+ 0x)")
_TICKET_RE = re.compile(r"[A-Z][A-Z0-9]{1,9}-\d{1,6}(?![\w-])|#\d{2,6}(?!\w)")
_CAMEL_RE = re.compile(r"[A-Z][a-z0-9]+[A-Z]")
_SNAKE_RE = re.compile(r"[a-z0-9]_[a-z0-9]")
_DOTTED_RE = re.compile(r"[A-Za-z_]\w\.[A-Za-z_]\w")
_DIGIT_RE = re.compile(r"\d")
_PATH_RE = re.compile(r"/[\w.-]+/|[\w-]/[\w-]+\.[A-Za-z]{1,5}\b")
_EXT_RE = re.compile(
    r"\.(?:py|pyi|js|mjs|ts|tsx|jsx|go|rs|java|kt|c|h|cc|cpp|hpp|rb|php|md|json|ya?ml|"
    r"toml|ini|cfg|txt|sh|sql|html|css|lock|log|csv|env)\b"
)
_URL_RE = re.compile(r"https?://[^\s)>\]]+")
# Possessive digit runs (\d++): what follows a run is never a digit, so giving digits back
# could not make a match; not trying it halves the cost of a line with numbers. And a match
# starts only where a run does (a digit with no digit before it: "\d(?<!\d\d)\d*+" is
# "\d++" begun there): from a digit inside a run the run ends at the same place and the rest
# is tried from the same point, so if the run's start fails, its other digits fail too; the
# scan no longer tries them (2 us instead of 3.4 per line with digits; the same spans).
_NUM_UNIT_RE = re.compile(
    r"\d(?<!\d\d)\d*+(?:[.,]\d++)?\s?(?:ms|s|secs?|seconds?|minutes?|mins?|h|hrs?|hours?|days?|[KMGT]i?B|"
    r"[kmg]b|bytes?|%|px|rps|qps|req/s|tokens?|lines?|files?|x|GHz|MHz)(?![A-Za-z])"
    r"|\d(?<!\d\d)\d*+\.\d++\.\d++"
)
_NUM_RE = re.compile(r"\d\d")
_QUOTED_RE = re.compile(r"\"[^\"\n]{2,80}\"|'[^'\n]{2,80}'|`[^`\n]{2,80}`")
_REQUEST_RE = re.compile(  # .match on the lower-cased line
    r"(?:please|pls|can you|could you|would you|let'?s|make|add|fix|implement|write|create|"
    r"update|remove|delete|change|rename|refactor|run|check|why|how|what|where|i want|i need)\b"
)
# In a huge source, the lines worth keeping beyond head and tail (lower-cased).
_STRONG_WORDS = ("error", "exception", "traceback", "fail", "todo", "fixme", "err_", "fatal",
                 "panic", "decided", "agreed", "let's use", "next step", "warn")
_FOCUS_STOP = frozenset(
    "the and for with that this from into about what when where which while have has had "
    "are was were will would should could can not but all any our your their its".split()
)


def _sanitize(text: str) -> str:
    # Lone surrogates would break any later UTF-8 encode; NULs and control
    # characters confuse terminals and prompts.  Same length in, same out.
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    return _CTRL_RE.sub(" ", text)


def _focus_terms(focus: str | None) -> list[str]:
    if not focus or not isinstance(focus, str):
        return []
    words = re.findall(r"[\w./:-]+", _sanitize(focus).lower())
    terms: list[str] = []
    for w in words:
        w = w.strip(".:-/")
        if len(w) >= 3 and w not in _FOCUS_STOP and w not in terms:
            terms.append(w)
    return terms[:12]


def _split_line(line: str, max_len: int) -> list[str]:
    if len(line) <= max_len:
        return [line]
    out: list[str] = []
    for sent in _SENTENCE_RE.split(line):
        pos, n = 0, len(sent)
        while n - pos > max_len:  # index-based: slicing the rest each time is quadratic
            cut = sent.rfind(" ", pos + max_len // 2, pos + max_len)
            cut = cut if cut > pos else pos + max_len
            out.append(sent[pos:cut].strip())
            pos = cut
        if sent[pos:].strip():
            out.append(sent[pos:].strip())
    return out


def _strong_re(focus: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(w) for w in (*_STRONG_WORDS, *focus)))


def _sample(items: list[str], strong: re.Pattern[str]) -> list[str]:
    """Head, tail, and the strong items in between, in order."""
    n = len(items)
    keep = list(range(_HEAD_TAIL_UNITS))
    budget = _MAX_UNITS_PER_SOURCE - 2 * _HEAD_TAIL_UNITS
    for k in range(_HEAD_TAIL_UNITS, n - _HEAD_TAIL_UNITS):
        if budget <= 0:
            break
        if strong.search(items[k].lower()):
            keep.append(k)
            budget -= 1
    keep.extend(range(n - _HEAD_TAIL_UNITS, n))
    return [items[k] for k in keep]


def _units_of(text: str, max_len: int, strong: re.Pattern[str]) -> list[str]:
    lines = text.split("\n")
    if len(lines) > _MAX_UNITS_PER_SOURCE:
        # A huge source: one scan of the whole lower-cased text finds the
        # strong lines (far cheaper than a search per line).
        low = text.lower()
        if len(low) == len(text):
            hits: list[int] = []
            line_no, last = 0, 0
            for m in strong.finditer(low):
                line_no += text.count("\n", last, m.start())
                last = m.start()
                if not hits or hits[-1] != line_no:
                    hits.append(line_no)
                    if len(hits) >= _MAX_UNITS_PER_SOURCE:
                        break
            mid = [k for k in hits if _HEAD_TAIL_UNITS <= k < len(lines) - _HEAD_TAIL_UNITS]
            mid = mid[: _MAX_UNITS_PER_SOURCE - 2 * _HEAD_TAIL_UNITS]
            idx = [*range(_HEAD_TAIL_UNITS), *mid, *range(len(lines) - _HEAD_TAIL_UNITS, len(lines))]
            lines = [lines[k] for k in idx]
        else:
            lines = _sample(lines, strong)
    units: list[str] = []
    for line in lines:
        if "  " in line or "\t" in line or "\u00a0" in line:
            line = _WS_RE.sub(" ", line)
        line = line.strip()
        if line and _HAS_WORD_RE.search(line):
            units.extend(_split_line(line, max_len))
    if len(units) > _MAX_UNITS_PER_SOURCE:  # a few enormous lines
        units = _sample(units, strong)
    return units


def _score(unit: str, role: str, focus: list[str]) -> int:
    low = unit.lower()
    words = set(_WORD_RE.findall(low))
    cats = {_WORD_CAT[w] for w in words.intersection(_WORD_CAT)}  # (the set intersection runs in C)
    for w in words.intersection(_PHRASES_BY_WORD):
        cats.update(_PHRASE_CAT[p] for p in _PHRASES_BY_WORD[w] if p in low)
    if "- [ ]" in unit:
        cats.add("t")
    score = 0
    if "d" in cats:
        score += 6
    if "t" in cats:
        score += 5
    if "e" in cats or any(map(unit.__contains__, _ERROR_TOKENS)) or ("E" in unit and _ERRNO_RE.search(unit)):
        score += 5
    if _EXC_LINE_RE.match(unit):
        score += 4  # the last line of a traceback says what went wrong
    if _FRAME_RE.match(unit):
        score -= 3  # stack frames: the exception line carries the news
    # Cheap substring gates in front of each regex: most lines have no digits,
    # slashes or quotes at all.
    has_digit = _DIGIT_RE.search(unit) is not None
    if has_digit:
        if any(map(low.__contains__, _HTTP_GATE)) and _HTTP_RE.search(low):
            score += 4
        if ("-" in unit or "#" in unit) and _TICKET_RE.search(unit):
            score += 4
        score += 2 if _NUM_UNIT_RE.search(unit) else (1 if _NUM_RE.search(unit) else 0)
    if ("/" in unit and _PATH_RE.search(unit)) or ("." in unit and _EXT_RE.search(unit)):
        score += 3
    if "://" in unit and _URL_RE.search(unit):
        score += 2
    score += min(3, (_CAMEL_RE.search(unit) is not None) + ("_" in unit and _SNAKE_RE.search(unit) is not None)
                 + ("." in unit and _DOTTED_RE.search(unit) is not None) + ("()" in unit))
    if '"' in unit or "'" in unit or "`" in unit:
        score += min(2, len(_QUOTED_RE.findall(unit)))
    if role == "user":
        score += 3
        if _REQUEST_RE.match(low) or low.endswith("?"):
            score += 2
    elif role == "summary":
        score += 2
    elif role == "system":
        score -= 1
    if focus:
        hits = sum(1 for t in focus if t in low)
        if hits:
            score += 12 * hits + (6 if hits > 1 else 0)
    if len(unit) < 12:
        score -= 3
    return score


# A line is scored again when it comes back (a condensed summary re-reads its leaves' lines,
# a repeated tool line): a third of the lines of a generated coding session's passes.
@functools.lru_cache(maxsize=4096)
def _score_cached(unit: str, role: str, focus: tuple[str, ...]) -> int:
    return _score(unit, role, list(focus))


def _clip(text: str, limit: int) -> str:
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    cut = max(0, limit - 1)
    # Never cut inside a "[REDACTED:kind]" marker: redacting the summary
    # again would re-expand a clipped one past the budget.
    k = text.rfind("[", max(0, cut - 48), cut)
    if k >= 0 and text.startswith("[REDACTED", k) and text.find("]", k, cut) < 0:
        cut = k
    return text[:cut] + "\u2026"


def _headers(sources: Sequence[Source], ids: list[str], kept: int, total: int,
             aggressive: bool) -> list[str]:
    """The header at decreasing levels of detail: full, without times, bare span."""
    span = ids[0] if len(ids) == 1 or ids[0] == ids[-1] else f"{ids[0]}..{ids[-1]}"
    n = len(sources)
    parts = [f"{span}: {n} source{'s' if n != 1 else ''}"]
    stamps = [_sanitize(str(s.timestamp))[:32] for s in sources if s.timestamp]
    when = ""
    if stamps:
        when = stamps[0] if stamps[0] == stamps[-1] else f"{stamps[0]} .. {stamps[-1]}"
    count = "" if aggressive else f"{kept}/{total} lines kept"
    full = "[" + ", ".join(p for p in (parts[0], when, count) if p) + "]"
    return [full, "[" + ", ".join(p for p in (parts[0], count) if p) + "]", f"[{span}]"]


def _summarize(sources: Sequence[Source], target_tokens: int, focus: str | None,
               aggressive: bool) -> str:
    eff_target = max(1, target_tokens // 2) if aggressive else target_tokens
    cap = eff_target * 4
    texts = [_sanitize(s.text if isinstance(s.text, str) else str(s.text)) for s in sources]
    in_chars = sum(len(t) for t in texts)
    if sum(estimate_text_tokens(t) for t in texts) > target_tokens:
        cap = min(cap, in_chars - 1)  # always shorter than what it summarises
    if cap <= 0:
        return ""
    ids = [_sanitize(str(s.id)).strip()[:40] or "?" for s in sources]
    roles = [_sanitize(str(s.role)).strip().lower()[:16] or "?" for s in sources]
    if not sources:
        return _clip("[no sources]", cap)

    terms = _focus_terms(focus)
    strong = _strong_re(terms)
    max_len = _MAX_UNIT_AGGRESSIVE if aggressive else _MAX_UNIT
    units: list[tuple[int, int, str]] = []  # (source index, unit index, text)
    seen: set[str] = set()
    total = 0
    for si, text in enumerate(texts):
        for ui, unit in enumerate(_units_of(text, max_len, strong)):
            total += 1
            key = unit.lower()
            if roles[si] == "tool":
                key = _DIGITS_RE.sub("#", key)  # log lines differing only in counters
            if key in seen:
                continue  # a repeated line says nothing new
            seen.add(key)
            units.append((si, ui, unit))
    if not units:
        return _clip(_headers(sources, ids, 0, 0, aggressive)[0], cap)

    fterms = tuple(terms)
    scores = [_score_cached(u, roles[si], fterms) for si, _, u in units]
    # Position: the span's first user request, and where the work stands at the end.
    first_user = next((si for si, r in enumerate(roles) if r == "user"), None)
    last_src = units[-1][0]
    last_asst = max((si for si, r in enumerate(roles) if r == "assistant"), default=None)
    prev_si = -1
    for k, (si, _ui, _) in enumerate(units):
        if si == first_user:
            scores[k] += 6 if si != prev_si else 2
        if si == last_src:
            scores[k] += 3
        if si == last_asst:
            scores[k] += 3
        prev_si = si

    def prefix(si: int) -> str:
        role = _ROLE_SHORT.get(roles[si], roles[si]) if aggressive else roles[si]
        return f"- [{ids[si]} {role}] " if aggressive else f"[{ids[si]} {role}] "

    # A tight budget is spent on content, not on the header: take the most
    # detailed level that fits in a quarter of it.  The real header (with
    # the kept count) is never longer than this estimate.
    levels = _headers(sources, ids, total, total, aggressive)
    level = next((i for i, h in enumerate(levels) if len(h) <= cap // 4), len(levels) - 1)
    header = levels[level]
    room = cap - len(header) - 1
    chosen: dict[int, list[int]] = {}
    used = 0
    order = sorted(range(len(units)), key=lambda k: (-scores[k], k))
    # The best line always makes it, clipped if it must be.
    top_si, top_ui, top_text = units[order[0]]
    top_text = _clip(top_text, room - len(prefix(top_si)) - 1)
    if len(top_text) >= 8 or top_text == units[order[0]][2]:
        units[order[0]] = (top_si, top_ui, top_text)
        chosen[top_si] = [order[0]]
        used = len(prefix(top_si)) + len(top_text) + 1
    for k in order[1:]:
        if aggressive and scores[k] <= 0:
            break  # terse: no filler, even when it would fit
        si, ui, text = units[k]
        overhead = len(_SEP) if si in chosen else len(prefix(si)) + 1
        if used + overhead + len(text) > room:
            if scores[k] < _CLIP_SCORE or room - used - overhead < _MIN_CLIP:
                continue
            # A valuable line that does not fit whole is worth its first words
            # more than a filler line that does.
            text = _clip(text, room - used - overhead)
            units[k] = (si, ui, text)
        chosen.setdefault(si, []).append(k)
        used += overhead + len(text)
        if room - used < 12:
            break
    header = _headers(sources, ids, sum(len(v) for v in chosen.values()), total, aggressive)[level]
    lines = [header]
    for si in sorted(chosen):
        ks = sorted(chosen[si])
        body = units[ks[0]][2]
        for a, b in zip(ks, ks[1:]):
            body += (" | " if units[b][1] == units[a][1] + 1 else _SEP) + units[b][2]
        lines.append(prefix(si) + body)
    return _clip("\n".join(lines), cap)


def extractive_summary(sources: Sequence[Source], target_tokens: int, focus: str | None = None,
                       aggressive: bool = False) -> str:
    """Summarise `sources` by keeping their most useful lines, in original order.

    The result's estimated tokens ((len+3)//4) never exceed `target_tokens`
    (half of it when `aggressive`), and it is shorter than the input whenever
    the input is larger than the target.  Each kept line is prefixed with its
    source id and role (``[m123 user] ...``) under a one-line header giving
    the span, the number of sources and the time range.  Lines mentioning the
    `focus` terms are strongly preferred.  Deterministic; never raises; returns
    "" for a non-positive target.
    """
    try:
        target = int(target_tokens)
    except Exception:
        return ""
    if target <= 0:
        return ""
    try:
        return _summarize(list(sources or ()), target, focus, bool(aggressive))
    except Exception:  # pragma: no cover - the last level of escalation must not fail
        try:
            n = len(sources)
        except Exception:
            n = 0
        return _clip(f"[{n} sources; extractive summary unavailable]", target * 4 - 1)
