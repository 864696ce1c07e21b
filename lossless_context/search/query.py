"""Turn any user search string into safe search plans (SQLite FTS5, PostgreSQL, LIKE).

Agents search with questions ("what did we decide about the retry limit?"), identifiers
(``models.py``, ``ERR_TIMEOUT``, ``QX-1234``, ``getUserById``) and quoted phrases.
:func:`plan_query` never raises for any ``str``; see :class:`QueryPlan` for its fields.

* FTS5: every item of ``fts_match`` is a double-quoted string (``"`` doubled), so no FTS5
  syntax typed by the user (AND OR NOT NEAR ( ) * : ^ + -) can leak. Bind it as a parameter.
* Substrings: CJK/Thai/Hangul... runs (one unicode61 token per run), emoji (separators to
  unicode61) and punctuation-only queries go to ``substrings`` for ``LIKE ? ESCAPE '\\'``
  (:func:`like_pattern`) or ``instr``.
* PostgreSQL: ``pg_tsquery`` is input for ``to_tsquery('english', %s)``: single-quoted
  operands (only ``\\w`` and ``. - / @ : =``; never ``'``, ``\\`` or empty) joined by ``|``,
  phrases by ``<->``. Keeping ``.``/``/`` lets identifiers parse to the same lexemes as
  ``to_tsvector`` (``'models.py'``, ``'src/billing/invoice.py'``).

Limits: queries are cut to ``MAX_QUERY_CHARS`` (at a space when possible); NUL and other
control characters become spaces; lone surrogates are dropped (pairs are joined). ``"…"``,
``\u201c…\u201d`` and backticks delimit phrases; an unbalanced quote is ignored and the
rest of the query is read as ordinary words.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

# lcm_grep's regex mode lives in regex.py (a pattern is matched in a process of its own, bounded in
# time); its entry points are named here too, where the other search plans are.
from .regex import MAX_REGEX_CHARS, compile_regex, regex_search_bounded

__all__ = ["MAX_QUERY_CHARS", "MAX_REGEX_CHARS", "STOP_WORDS", "QueryPlan", "plan_query",
           "like_escape", "like_pattern", "score_hit", "snippet", "compile_regex",
           "regex_search_bounded"]

MAX_QUERY_CHARS = 1000
MAX_SUBSTRINGS = 8
MAX_PG_OPERAND_BYTES = 2000  # PostgreSQL never indexes words over 2047 bytes
SCAN_CHARS = 1_000_000  # score_hit / snippet look at most this much of a hit
EXACT_BONUS, SUBSTRING_BONUS, CASE_BONUS, TERM_BONUS = 100.0, 50.0, 5.0, 1.0
BM25_K1, BM25_B, MAX_TF = 1.2, 0.75, 64  # the usual BM25 constants; counting stops at MAX_TF

STOP_WORDS: frozenset[str] = frozenset("""
a about above after again against ago all also am an and any anything are aren't as at
be because been before being below between both but by can can't cannot could couldn't
did didn't do does doesn't doing don't dont didnt down during each earlier either else
ever every everything few find for from further get gets got had hadn't has hasn't have
haven't having he he'd he'll he's her here here's hers herself hey him himself his how
how's i i'd i'll i'm i've if im in into is isn't it it's its itself just let let's lets
like look me mention mentioned more most much must mustn't my myself no nor not of off
ok okay on once one only or other ought our ours ourselves out over own please previously
recall remember said same say says search shall shan't she she'd she'll she's should
shouldn't show so some something such tell than that that's thats the their theirs them
themselves then there there's these they they'd they'll they're they've thing things this
those through to too under until up upon us very want was wasn't way we we'd we'll we're
we've were weren't what what's whats when when's where where's whether which while who
who's whom whose why why's will with won't would wouldn't yet you you'd you'll you're
you've your yours yourself yourselves
""".split())

_FTS_OPERATORS = frozenset({"and", "or", "not", "near"})
_ABBREVIATIONS = frozenset({"e.g", "i.e", "a.m", "p.m", "u.s", "u.k", "etc", "vs"})

_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CUT = re.compile(r"\s\S*\Z")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_PHRASE = re.compile('"([^"]*)"|\u201c([^\u201d]*)\u201d|`([^`]*)`')
# Scripts written without spaces between words (plus Hangul, whose particles attach to
# words): unicode61 makes a whole run one token, so FTS5 cannot find words inside it.
_NOSPACE = re.compile(
    "[\u0e00-\u0fff\u1000-\u109f\u1100-\u11ff\u1780-\u17ff\u19e0-\u19ff\u3005-\u3007"
    "\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
    "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]+")
# Emoji and other pictographs: unicode61 treats them as separators.
_SYMBOLS = re.compile("[\u2190-\u2bff\u200d\u20e3\ufe0f\U0001f000-\U0001faff"
                      "\U000e0020-\U000e007f]+")
_JOINERS = frozenset("\u200d\u20e3\ufe0f")
_PIECE_SPLIT = re.compile(r"[^\w'./\\:@=\-]+")
_EDGES = re.compile(r"^\W+|\W+$")
_SEP_IDENT = re.compile(r"[^\W_](?:::|[./\\:@=\-])[^\W_]|[^\W_]_|_[^\W_]")
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_ALNUM = re.compile(r"[^\W_]")
_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th|s)", re.IGNORECASE)
_PG_OPERAND = re.compile(r"[\w./@:=\-]+")


@dataclass(frozen=True)
class QueryPlan:
    """How to search for one user query; build it with :func:`plan_query`."""

    query: str  # the sanitised, truncated query text
    terms: tuple[str, ...] = ()  # lowercased words for ranked OR matching
    exact: tuple[str, ...] = ()  # phrases and identifiers, verbatim (rank first)
    fts_match: str | None = None  # FTS5 MATCH: every item OR-ed (recall)
    fts_match_all: str | None = None  # FTS5 MATCH: every item AND-ed (precision)
    needs_substring: bool = False  # also run a LIKE/instr search with `substrings`
    substrings: tuple[str, ...] = ()  # raw text for LIKE/instr (bound parameters)
    pg_tsquery: str | None = None  # to_tsquery('english', ...) input, OR-ed
    pg_tsquery_all: str | None = None  # to_tsquery('english', ...) input, AND-ed
    truncated: bool = False  # the query was longer than MAX_QUERY_CHARS
    fts_items: tuple[str, ...] = ()  # one quoted FTS5 phrase per indexable item
    pg_items: tuple[str | None, ...] = ()  # the same items as tsquery operands (None: unusable)
    items: tuple[str, ...] = ()  # the same items as typed (exact items, then terms)

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to search for at all."""
        return self.fts_match is None and not self.substrings

    def subset(self, items: Sequence[int], op: str) -> "QueryPlan":
        """This plan narrowed to some indexable items (indexes into ``fts_items``), joined by
        ``op`` ("AND" or "OR") — the relaxed queries of a ranked search."""
        fts = [self.fts_items[i] for i in items if 0 <= i < len(self.fts_items)]
        pg = [p for i in items if 0 <= i < len(self.pg_items) for p in (self.pg_items[i],) if p]
        joiner = " | " if op == "OR" else " & "
        return dataclasses.replace(
            self, fts_match=f" {op} ".join(fts) or None, pg_tsquery=joiner.join(pg) or None)


def _clean(q: object) -> tuple[str, bool]:
    if not isinstance(q, str):
        q = str(q) if isinstance(q, (int, float)) else ""
    truncated = len(q) > MAX_QUERY_CHARS
    if truncated:  # cut at the last whitespace near the limit so no word is split
        q = q[:MAX_QUERY_CHARS]
        m = _CUT.search(q, MAX_QUERY_CHARS - 64)
        q = q[: m.start()] if m else q
    q = _SURROGATE_PAIR.sub(
        lambda m: chr(0x10000 + ((ord(m[0][0]) - 0xD800) << 10) + ord(m[0][1]) - 0xDC00), q)
    q = _CONTROL.sub(" ", _SURROGATE.sub(" ", q))
    return q.replace("\u2019", "'").replace("\u2018", "'").strip(), truncated


def _collapse(s: str) -> str:
    return " ".join(s.split())


def _add(bucket: list[str], seen: set[str], item: str) -> None:
    key = item.casefold()
    if item and key not in seen:
        seen.add(key)
        bucket.append(item)


def _is_camel(w: str) -> bool:
    if len(w) > 2 and w[:-1].isupper() and w[-1] == "s":
        return False  # plural acronym: URLs, APIs, PRs
    return any(a.islower() and b.isupper() for a, b in zip(w, w[1:])) or any(
        a.isupper() and b.isupper() and c.islower() for a, b, c in zip(w, w[1:], w[2:]))


def _extract_runs(text: str, regex: re.Pattern[str], out: list[str]) -> str:
    def keep(m: re.Match[str]) -> str:
        if any(c not in _JOINERS for c in m[0]):
            out.append(m[0])
        return " "
    return regex.sub(keep, text)


def _pg_operand(s: str) -> str | None:
    """A phrase/word as to_tsquery input: single-quoted operands, `<->` between words."""
    parts = [p.encode()[:MAX_PG_OPERAND_BYTES].decode("utf-8", "ignore")
             for p in _PG_OPERAND.findall(s) if _ALNUM.search(p)]
    if not parts:
        return None
    quoted = [f"'{p}'" for p in parts]
    return quoted[0] if len(quoted) == 1 else "(" + " <-> ".join(quoted) + ")"


def plan_query(q: str, max_terms: int = 32) -> QueryPlan:
    """Plan a search for any string; never raises (see the module docstring)."""
    text, truncated = _clean(q)
    max_terms = max(1, max_terms) if isinstance(max_terms, int) else 32
    exact: list[str] = []
    exact_seen: set[str] = set()
    subs: list[str] = []
    subs_seen: set[str] = set()

    # 1. Quoted phrases: "…", “…”, `…`.
    for m in _PHRASE.finditer(text):
        phrase = _collapse(next(g for g in m.groups() if g is not None))
        if _NOSPACE.search(phrase):
            _add(exact, exact_seen, phrase)
            _add(subs, subs_seen, phrase)
        elif _ALNUM.search(phrase):
            _add(exact, exact_seen, phrase)
        elif phrase:
            _add(subs, subs_seen, phrase)  # punctuation/emoji only: substring search
    rest = _PHRASE.sub(" ", text)

    # 2. Runs FTS5 cannot tokenise usefully.
    runs: list[str] = []
    rest = _extract_runs(rest, _NOSPACE, runs)
    rest = _extract_runs(rest, _SYMBOLS, runs)
    for r in runs:
        _add(subs, subs_seen, r)

    # 3. Identifier-like pieces and plain words.
    words: list[tuple[str, str]] = []  # (kind, word) with kind in {"ident", "caps", "word"}
    for raw in _PIECE_SPLIT.split(rest):
        piece = _EDGES.sub("", raw)
        if not _ALNUM.search(piece) or piece.lower() in _ABBREVIATIONS:
            continue
        if _SEP_IDENT.search(piece):
            words.append(("ident", piece))
            continue
        for w in _WORD.findall(piece):
            if _is_camel(w) or (any(c.isdigit() for c in w) and any(c.isalpha() for c in w)
                                and not _ORDINAL.fullmatch(w)):
                words.append(("ident", w))
            elif (len(w) > 1 and w.isupper() and w.lower() not in STOP_WORDS
                  and w.lower() not in _FTS_OPERATORS):
                words.append(("caps", w))
            else:
                words.append(("word", w))
    upper = sum(1 for _, w in words if len(w) > 1 and w.isupper())
    shouting = upper >= 3 and upper * 2 > len(words)

    terms: list[str] = []
    terms_seen: set[str] = set()
    all_words: list[str] = []
    for kind, w in words:
        if kind == "ident" or (kind == "caps" and not shouting):
            _add(exact, exact_seen, w)
            continue
        lw = w.lower()
        parts = [] if lw in STOP_WORDS else (lw[:-2] if lw.endswith("'s") else lw).split("'")
        all_words.extend(p for p in lw.split("'") if p)
        for p in parts:
            if p and p not in STOP_WORDS:
                _add(terms, terms_seen, p)
    if not terms and not exact and not subs:
        for w in all_words:  # only stop words: better to search for them than nothing
            _add(terms, terms_seen, w)

    exact, terms, subs = exact[:max_terms], terms[:max_terms], subs[:MAX_SUBSTRINGS]
    indexable = [e for e in exact if not _NOSPACE.search(e)] + terms
    fts = ['"' + s.replace('"', '""') + '"' for s in indexable]
    pg_items = [_pg_operand(s) for s in indexable]
    pg = [op for op in pg_items if op]
    if not fts and not subs and any(unicodedata.category(c)[0] not in "CZ" for c in text):
        subs = [_collapse(text)]
    return QueryPlan(
        query=text, terms=tuple(terms), exact=tuple(exact),
        fts_match=" OR ".join(fts) or None, fts_match_all=" AND ".join(fts) or None,
        needs_substring=bool(subs), substrings=tuple(subs),
        pg_tsquery=" | ".join(pg) or None, pg_tsquery_all=" & ".join(pg) or None,
        truncated=truncated, fts_items=tuple(fts), pg_items=tuple(pg_items),
        items=tuple(indexable))


def like_escape(s: str) -> str:
    """Escape ``\\``, ``%`` and ``_`` for ``LIKE ? ESCAPE '\\'`` (SQLite and PostgreSQL)."""
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def like_pattern(s: str, contains: bool = True) -> str:
    """A LIKE pattern for ``LIKE ? ESCAPE '\\'``; ``%…%`` (substring match) by default."""
    escaped = like_escape(s)
    return f"%{escaped}%" if contains else escaped


def _stem(term: str) -> str:
    for suffix in ("ations", "ation", "ings", "ing", "ies", "ied", "ed", "es", "s", "y", "e"):
        if term.endswith(suffix) and len(term) - len(suffix) >= 3:
            return term[: -len(suffix)]
    return term


def _term_regex(terms: tuple[str, ...]) -> re.Pattern[str] | None:
    if not terms:
        return None
    alts = [re.escape(t) + r"(?!\w)" if len(t) <= 3 or t.isdigit() else re.escape(_stem(t))
            for t in sorted(terms, key=len, reverse=True)]
    return re.compile(r"(?<!\w)(?:" + "|".join(alts) + ")", re.IGNORECASE)


def score_hit(plan: QueryPlan, text: str, idf: dict[str, float] | None = None,
              avg_chars: float = 2_000.0) -> float:
    """Ranking score of one candidate: +100 per exact item (+5 more if the case also matches),
    +50 per substring, and per term (crudely stemmed, word-start match) +1 — or, given ``idf``
    (term → weight), BM25's saturated term frequency times that weight, normalised by the
    text's length against ``avg_chars``."""
    if not text or not isinstance(text, str):
        return 0.0
    raw = text[:SCAN_CHARS]
    flat = _collapse(raw).casefold()
    score = sum(EXACT_BONUS + (CASE_BONUS if e in raw else 0.0)
                for e in plan.exact if _collapse(e).casefold() in flat)
    score += sum(SUBSTRING_BONUS for s in plan.substrings if _collapse(s).casefold() in flat)
    if idf is None:
        return score + sum(TERM_BONUS for t in plan.terms if _term_count(flat, t, 1))
    norm = BM25_K1 * (1 - BM25_B + BM25_B * len(flat) / max(avg_chars, 1.0))
    for t in plan.terms:
        tf = _term_count(flat, t, MAX_TF)
        if tf:
            score += idf.get(t, 1.0) * tf * (BM25_K1 + 1) / (tf + norm)
    return score


def _term_count(flat: str, term: str, cap: int) -> int:
    """Word-start occurrences of ``term`` (crudely stemmed, as :func:`_term_regex` matches) in
    casefolded ``flat``, up to ``cap``. A plain substring scan checked at the edges: a regex
    that opens with a look-behind cannot use the literal-prefix search and is ~10× slower."""
    needle, whole = _needle(term)
    found = looked = 0
    i = flat.find(needle)
    while i >= 0 and found < cap and looked < cap * 16:
        looked += 1
        j = i + len(needle)
        if (i == 0 or not _is_word(flat[i - 1])) and (not whole or j >= len(flat) or not _is_word(flat[j])):
            found += 1
        i = flat.find(needle, j)
    return found


@functools.lru_cache(maxsize=4096)
def _needle(term: str) -> tuple[str, bool]:
    """What :func:`_term_count` looks for, and whether it must end a word (short terms and
    numbers match whole): the same few terms are looked up in every candidate of a search."""
    whole = len(term) <= 3 or term.isdigit()
    return (term if whole else _stem(term)).casefold(), whole


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _first_span(flat: str, plan: QueryPlan) -> tuple[int, int] | None:
    literal = [s for s in (*plan.exact, *plan.substrings) if s.strip()]
    if literal:
        alts = sorted((re.escape(_collapse(s)) for s in literal), key=len, reverse=True)
        m = re.search("|".join(alts), flat, re.IGNORECASE)
        if m:
            return m.span()
    rx = _term_regex(plan.terms)
    m = rx.search(flat) if rx else None
    return m.span() if m else None


def snippet(text: str, plan: QueryPlan, width: int = 160) -> str:
    """About ``width`` chars of ``text`` (whitespace collapsed) around the first exact
    match, else the first term match, else the start; ``…`` marks cut ends."""
    if not text or not isinstance(text, str):
        return ""
    width = max(16, int(width))
    flat = _collapse(text[:SCAN_CHARS])
    if len(flat) <= width:
        return flat
    span = _first_span(flat, plan) or (0, 0)
    s, e = span
    start = s if e - s >= width else max(0, s - (width - (e - s)) // 2)
    end = min(len(flat), start + width)
    start = max(0, min(start, end - width))
    if start > 0:  # do not start mid-word when a space is close (and before the match)
        sp = flat.find(" ", start, min(start + 20, s))
        start = sp + 1 if sp != -1 else start
    if end < len(flat):
        sp = flat.rfind(" ", max(end - 20, e, start + 1), end)
        end = sp if sp != -1 else end
    return ("…" if start > 0 else "") + flat[start:end].strip() + ("…" if end < len(flat) else "")
