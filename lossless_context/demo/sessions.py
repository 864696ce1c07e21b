"""Deterministic generators of realistic long agent sessions (demo, benchmarks, tests).

Holds the synthetic-session toolkit: `coding_session`, `chat_session` and `mixed_session`
build OpenAI chat-completions message lists (no system message; prepend `SYSTEM_PROMPT`
if wanted) and `iter_*_messages` yield the same messages lazily for million-message runs.
Sessions are seeded with private `random.Random` instances, so equal arguments always
give byte-identical output. Each session plants `Canary` facts (a value that occurs
exactly once in the whole session, with a question whose answer it is) so recall can
be measured. `pipeline.validate.sequence_problems` checks tool-call pairing and content types;
`check_canaries` checks canary uniqueness (both in session_checks.py, re-exported here).
Everything generated is ASCII.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from itertools import islice
from string import Template
from typing import Any, Iterator, Sequence
from .session_checks import check_canaries  # noqa: F401 - re-exported
from .session_data import _AREAS, _ASK, _AUTHORS, _BODY, _BUGS, _CASES, _CLOSERS, _CONDITIONS, _C_CTX, _C_DIRS, _C_ERR, _C_FIRST, _C_KINDS, _C_LAST, _C_PASS, _C_TICKET, _C_WORDS, _ERRORS, _EVENTS, _EXPLORE, _FACTS, _FEATURES, _FIX, _INTROS, _JOBS, _LATER, _LEVELS, _PATHS, _REASONS, _SLOT, _SVC, _SVC2, _SYMPTOMS, _TABLES, _TEAMS, _THINGS, _TOGGLES, _TOPICS, _TOPIC_NAMES, _TREE, _t

__all__ = [
    "SYSTEM_PROMPT", "SESSION_KINDS", "Canary", "Session", "SessionStream", "coding_session", "chat_session",
    "mixed_session", "make_session", "iter_coding_messages", "iter_chat_messages",
    "iter_mixed_messages", "check_canaries", "turn_ranges",
]

SYSTEM_PROMPT = (
    "You are Hermes, an AI agent that helps with software work and everyday questions. "
    "You are working in the repository acme-ledger (Python 3.11, Postgres, pytest). Use the "
    "tools read_file, search_files, patch, write_file and terminal to inspect and change code; "
    "prefer small, verified edits and run the relevant tests after every change. Explain "
    "decisions briefly and state them explicitly (\"Decision: ...\") so they can be found later. "
    "When the user chats about non-code topics, answer helpfully and concisely."
)
SESSION_KINDS = ("coding", "chat", "mixed")
_PH = "@@CANARY@@"  # placeholder replaced by a canary value after scrubbing
_RUN5 = re.compile(r"\d{5,}")
_ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_B62 = bytes(_ALNUM[i % 62] for i in range(256))  # byte -> alphanumeric (for tool call ids)


@dataclass(frozen=True)
class Canary:
    key: str
    kind: str  # number_in_tool_output | path_in_decision | error_string | name_said_once | ...
    value: str  # the exact string planted; it occurs nowhere else in the session
    message_index: int  # index into the message list where it was planted
    question: str  # natural-language question whose answer is `value`


def turn_ranges(messages: Sequence[dict]) -> list[tuple[int, int]]:
    """Half-open (start, end) ranges: a user message plus everything up to the next user message.

    Messages before the first user message (if any) form a leading range of their own."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if messages and (not starts or starts[0] != 0):
        starts.insert(0, 0)
    return list(zip(starts, starts[1:] + [len(messages)]))


@dataclass
class Session:
    kind: str
    seed: int
    messages: list[dict]
    canaries: list[Canary]
    final_question: Canary | None = None  # the canary the last user message asks about

    def turns(self) -> list[tuple[int, int]]:
        return turn_ranges(self.messages)


# --------------------------------------------------------------------------- vocabulary



def _ftype(f: str) -> str:
    if f.endswith("_at"):
        return "datetime | None = None"
    if f in ("subtotal", "amount", "rate", "total", "expected_total", "actual_total", "percent_off", "base_delay"):
        return 'Decimal = Decimal("0")'
    if f in ("attempts", "max_attempts", "retry_limit", "metrics_port", "mismatches"):
        return "int = 0"
    return "list[dict] = field(default_factory=list)" if f in ("line_items", "payload") else 'str = ""'


def _mutate(line: str, reason: str) -> str:
    """A plausible one-line fix; edits toggle or stay bounded so files never grow over a session."""
    if "  # " in line:
        return line.split("  # ")[0]
    new = re.sub(r"\b\d+\b", lambda m: str(int(m.group()) % 97 + 1), line, count=1)
    if new != line:
        return new
    for a, b in _TOGGLES:
        if a in line:
            return line.replace(a, b, 1)
    return f"{line}  # {reason}"


def _trie_regex(words: Sequence[str]) -> str:
    """A regex matching exactly `words` (all the same length), nested as a trie so search stays fast."""
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})

    def emit(node: dict) -> str:
        parts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items())]
        return "" if not parts else parts[0] if len(parts) == 1 else f"(?:{'|'.join(parts)})"

    return emit(trie)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _fill(template: str, **kw: Any) -> str:
    return Template(template).safe_substitute(kw)


def _terminal(command: str, output: str, code: int = 0) -> tuple[str, dict, str]:
    return "terminal", {"command": command}, json.dumps({"output": output, "exit_code": code, "error": None})


# --------------------------------------------------------------------------- generator

# Canary plantings: name -> (subject, question, text). Text is a user-message preface or an assistant
# message; for tool canaries it is the tool output and _TOOL_CMD holds the command. {v} is the value.
_PLANT = {
    "name_said_once/coding": ("the {area} code in {svc}", "Who owns {s}?",
                              "FYI, {v} from {team} owns {s} and wants to review changes. "),
    "name_said_once/chat": ("the {rel} who recommended {rec}", "What is the name of {s}?",
                            "By the way, {s} was {v} - I keep forgetting. "),
    "ticket_id/coding": ("the {bug} in {svc}", "What ticket tracks {s}?", "This is tracked as {v} ({s}). "),
    "ticket_id/chat": ("my {matter} with {org}", "What reference number did I get for {s}?",
                       "Noting it here: the reference for {s} is {v}. "),
    "number_in_chat": ("the {place} in {city}", "What is the door code for {s}?",
                       "The door code for {s} is {v}, in case I forget. "),
    "passphrase_in_chat": ("the {place} we booked for {month}", "What is the wifi password at {s}?",
                           "Writing this down: the wifi password at {s} is {v}. "),
    "path_in_decision": ("{thing} for {svc}", "Where did we decide to move the {s}?",
                         "Decision: we'll keep the current defaults and move the {s} to {v}, so ops can change it "
                         "without a deploy. I'll reference that file from src/common/config.py."),
    "error_string": ("the {job} job for {date}", "What exact error code did {s} fail with?",
                     '{log}\nTraceback (most recent call last):\n  File "scripts/{job}.py", line {n1}, in main\n'
                     '    run(args.date)\n  File "src/ledger/reconcile.py", line {n2}, in flag_drift\n'
                     "    raise ReconcileError(code, detail)\nsrc.ledger.errors.ReconcileError: {v}: drift of "
                     "{n1}.{n2} USD exceeds tolerance for {date}\n"),
    "port": ("{svc}", "What port did we move the {s} metrics server to?",
             "diff --git a/deploy/{svc}/values.yaml b/deploy/{svc}/values.yaml\nindex {h1}..{h2} 100644\n"
             "--- a/deploy/{svc}/values.yaml\n+++ b/deploy/{svc}/values.yaml\n@@ -14,7 +14,7 @@ metrics:\n"
             "   enabled: true\n   path: /metrics\n-  port: 9{n1}\n+  port: {v}\n   scrape_interval: 15s\n"),
    "rows": ("{table}", "How many rows did the backfill write into {s}?",
             "{log}\nbackfill complete: {v} rows written to {table}\n"),
    "queue": ("queue:{svc}", "What was the depth of the {s} queue when we checked it with redis-cli?",
              "(integer) {v}\n"),
}
_TOOL_CMD = {"error_string": "python -m scripts.{job} --date {date}",
             "port": "git diff HEAD~1 -- deploy/{svc}/values.yaml",
             "rows": "python -m scripts.backfill_ledger --table {table} --commit",
             "queue": "redis-cli -h queue-redis LLEN queue:{svc}"}
_PICK = {"area": _AREAS, "team": _TEAMS, "bug": _BUGS, "thing": _THINGS, "city": _TOPICS["travel"]["city"],
         "month": _TOPICS["travel"]["month"], "rel": _t("neighbour|colleague|cousin|friend"),
         "rec": _t("the bakery|the dentist|the plumber|the hike|the tailor"),
         "matter": _t("passport renewal|insurance claim|tax appeal|parking permit"),
         "org": _t("the city office|the agency|customer service|the bank"),
         "place": _t("cabin|flat|studio|rental|guesthouse|co-working space")}


@dataclass
class _Plan:
    kind: str
    target: int  # plant at the first fitting point at or after this index
    value: str


class SessionStream(Iterator[dict]):
    """A lazily generated session: iterate it for messages; `canaries` grows as they are planted.

    After exhaustion `canaries` is complete and `final_question` is the canary asked about by the
    last user message (None if no canary was planted or `final_question=False`)."""

    def __init__(self, kind: str, n_messages: int, seed: int = 0, *, repeat_tool_ids: bool = False,
                 final_question: bool = True) -> None:
        if kind not in SESSION_KINDS:
            raise ValueError(f"unknown session kind {kind!r}")
        if n_messages < 0:
            raise ValueError("n_messages must be >= 0")
        self.kind, self.n, self.seed = kind, n_messages, seed
        self.canaries: list[Canary] = []
        self.final_question: Canary | None = None
        self.index = 0  # messages yielded so far
        self._ask, self._repeat = final_question, repeat_tool_ids
        self._rng = random.Random(f"lossless-context/sessions/{kind}/{seed}")
        self._ids: set[str] = set()
        self._files: dict[str, str] = {}
        self._topic: str | None = None
        self._slots: dict[str, dict[str, str]] = {}
        self._questions: set[str] = set()
        self._coding_turns = 0
        self._plan, self._bigs = self._make_plan(random.Random(f"lossless-context/plan/{kind}/{seed}"))
        numbers = sorted({p.value for p in self._plan if p.value.isdigit()})
        self._num_re = re.compile(_trie_regex(numbers)) if numbers else None
        self._it = self._run()

    def __iter__(self) -> SessionStream:
        return self

    def __next__(self) -> dict:
        return next(self._it)

    def _make_plan(self, pr: random.Random) -> tuple[list[_Plan], list[int]]:
        """Canary kinds, values and target indexes, spread evenly with jitter; big-output targets."""
        n, k = self.n, max(4, self.n // 250)
        seen: set[str] = set()
        plan: list[_Plan] = []
        cycle: list[str] = []
        for idx in range(k):
            if not cycle:
                cycle = list(_C_KINDS[self.kind])
                pr.shuffle(cycle)
            kind = cycle.pop()
            tries = 0
            while (value := self._value(pr, kind, len(seen), tries > 50)) in seen:
                tries += 1
            seen.add(value)
            plan.append(_Plan(kind, max(0, min(int(n / k * (idx + 0.5 + pr.uniform(-0.3, 0.3))), n - 2)), value))
        nb = max(1, round(n / 400)) if self.kind != "chat" and n >= 300 else 0
        return plan, [min(int(n * (j + pr.uniform(0.1, 0.9)) / nb), n - 8) for j in range(nb)]

    @staticmethod
    def _value(pr: random.Random, kind: str, used: int, more: bool) -> str:
        """A canary value; `more` (after many collisions) switches to a larger value space."""
        if kind in ("number_in_tool_output", "number_in_chat"):
            return str(pr.randint(10000, 65535))  # always 5 digits: see _scrub
        if kind == "error_string":
            return f"ERR_{pr.choice(_C_ERR[0])}_{pr.choice(_C_ERR[1])}_{pr.randint(1000, 9999)}"
        if kind == "path_in_decision":
            tail = f"_{pr.randint(2, 99)}" if more else ""
            return f"{pr.choice(_C_DIRS)}/{pr.choice(_SVC)}_{pr.choice(_C_WORDS)}{tail}.{pr.choice(('yaml', 'toml'))}"
        if kind == "name_said_once":
            mid = "".join(f" {pr.choice('BCDFGHJKLMNPRSTVW')}." for _ in range(more + (used > 200)))
            return f"{pr.choice(_C_FIRST)}{mid} {pr.choice(_C_LAST)}"
        if kind == "ticket_id":
            return f"{pr.choice(_C_TICKET)}-{pr.randint(1000, 9999)}"
        words = f"{pr.choice(_C_PASS)}-{pr.choice(_C_PASS)}"  # the larger space uses "_" so forms never overlap
        return f"{words.replace('-', '_')}_{pr.randint(100, 999)}" if more else f"{words}-{pr.randint(10, 99)}"

    def _run(self) -> Iterator[dict]:
        r, n = self._rng, self.n
        # The last slot is kept for a question about a canary; chat sessions keep strict
        # user/assistant alternation, so they only ask when n is odd.
        reserve = self._ask and n >= 2 and (self.kind != "chat" or n % 2 == 1)
        limit, pi, bi = n - 1 if reserve else n, 0, 0
        turn: Iterator[list[dict]] | None = None
        ctx = "chat" if self.kind == "chat" else "coding"
        while True:
            if self.index >= limit:
                if not reserve or self.index != n - 1:
                    return
                reserve, limit = False, n
                if self.canaries:
                    c = self.final_question = r.choice(self.canaries[: (len(self.canaries) + 1) // 2])
                    yield self._emit({"role": "user", "content": r.choice(_ASK).format(q=c.question)})
                continue  # without a canary the slot gets an ordinary message
            room = limit - self.index
            due = self._plan[pi] if pi < len(self._plan) and self.index >= self._plan[pi].target else None
            big_due = bi < len(self._bigs) and self.index >= self._bigs[bi]
            slot = _SLOT.get(due.kind, "user") if due else None
            block: list[dict] | None = None
            planted: tuple[_Plan, str, int] | None = None  # plan, question, offset of the message in block
            if turn is None:
                want = _C_CTX.get(due.kind) if due else ("coding" if big_due else None)
                ctx = want if want and self.kind == "mixed" else self._pick_ctx(ctx)
                preface = ""
                if due and slot == "user":
                    q, preface, _ = self._plant(f"{due.kind}/{ctx}" if due.kind in ("name_said_once", "ticket_id")
                                                else due.kind)
                    planted = (due, q, 0)
                turn = self._coding_turn(preface) if ctx == "coding" else self._chat_turn(preface)
            elif due and slot != "user" and ctx == "coding":
                if room < (1 if slot == "assistant" else 2):
                    pi += 1  # no room left for this one
                    continue
                block, mark, q = self._plant_block(due)
                planted = (due, q, mark)
            elif big_due and ctx == "coding":
                bi += 1
                block = self._big_block() if room >= 2 else None
            if block is None and (block := next(turn, None)) is None:
                turn = None
                continue
            if len(block) > room:
                block = self._truncate(block, room)
            value, mark = None, -1
            if planted is not None:
                pi += 1
                plan, q, mark = planted
                value = plan.value
                self.canaries.append(Canary(f"c{len(self.canaries):03d}", plan.kind, value, self.index + mark, q))
            for j, m in enumerate(block):
                yield self._emit(m, value if j == mark else None)

    def _pick_ctx(self, ctx: str) -> str:
        if self.kind != "mixed":
            return self.kind
        return ctx if self._rng.random() < 0.6 else ("chat" if ctx == "coding" else "coding")

    def _emit(self, m: dict, value: str | None = None) -> dict:
        if isinstance(c := m.get("content"), str):
            c = self._scrub(c)
            m["content"] = c.replace(_PH, value) if value is not None else c
        for tc in m.get("tool_calls") or ():
            tc["function"]["arguments"] = self._scrub(tc["function"]["arguments"])
        self.index += 1
        return m

    def _scrub(self, s: str) -> str:
        """Perturb digits so that no 5-digit window of ordinary text equals a number canary.

        The other canary kinds use vocabulary that ordinary text never produces."""
        if self._num_re is None:
            return s
        # Number canaries lie in 10000..65535, so a window starting with 9 never is one. Each fix turns a
        # digit 1-6 into 9 (so this terminates) and can only create new hits in the 4 windows to its left.
        pos = 0
        while (m := self._num_re.search(s, pos)) is not None:
            s, pos = s[:m.start()] + "9" + s[m.start() + 1:], max(0, m.start() - 4)
        return s

    @staticmethod
    def _truncate(block: list[dict], room: int) -> list[dict]:
        """Cut the session's last block to `room` messages without leaving tool calls unanswered."""
        head = block[0]
        if head.get("tool_calls") and room >= 2:
            return [dict(head, tool_calls=head["tool_calls"][: room - 1]), *block[1:room]]
        if head.get("tool_calls"):
            return [{"role": "assistant", "content": head["content"] or "Next I'll re-run the test suite."}]
        return block[:room]

    def _call_id(self, j: int) -> str:
        if self._repeat:
            return f"call_{j}"
        while True:
            cid = "call_" + self._rng.randbytes(24).translate(_B62).decode()
            if cid not in self._ids and not _RUN5.search(cid):
                self._ids.add(cid)
                return cid

    def _step(self, text: str | None, calls: list[tuple[str, dict, str]]) -> list[dict]:
        """One assistant message with parallel tool calls, then one tool result per call, in order."""
        tcs, outs = [], []
        for j, (name, args, result) in enumerate(calls):
            cid = self._call_id(j)
            tcs.append({"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
            outs.append({"role": "tool", "tool_call_id": cid, "content": result})
        return [{"role": "assistant", "content": text, "tool_calls": tcs}, *outs]

    # ---- canaries
    def _plant(self, name: str) -> tuple[str, str, dict[str, str]]:
        """(question, text with the placeholder, slot values) for a planting; the question is new.

        After 40 colliding draws, identifiers get a numeric suffix (svc-3) or the subject a '#3'."""
        r, (subj, qt, tt) = self._rng, _PLANT[name]
        for attempt in range(100_000):
            k = 0 if attempt < 40 else attempt - 38
            f = {key: r.choice(opts) for key, opts in _PICK.items()}
            sfx = f"-{k}" if k else ""
            f.update(svc=f"{r.choice(_SVC)}-{r.choice(_SVC2)}{sfx}", job=r.choice(_JOBS) + sfx.replace("-", "_"),
                     table=r.choice(_TABLES) + r.choice(("", "_2023", "_2024", "_archive")) + sfx.replace("-", "_p"),
                     date=f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}", n1=str(r.randint(100, 999)),
                     n2=str(r.randint(10, 99)))
            s = subj.format(**f) + (f" #{k}" if k and not re.search(r"\{(svc|job|table)\}", subj) else "")
            if (q := qt.format(s=s)) not in self._questions:
                self._questions.add(q)
                if name in _TOOL_CMD:
                    f.update(log="\n".join(islice(self._log_lines(f["date"]), r.randint(4, 12))), h1=self._hex(7),
                             h2=self._hex(7))
                return q, tt.format(s=s, v=_PH, **f), f
        raise RuntimeError("could not find a unique canary question")

    def _plant_block(self, p: _Plan) -> tuple[list[dict], int, str]:
        """(block, offset of the planted message, question) for an assistant or tool canary."""
        name = p.kind if p.kind != "number_in_tool_output" else ("port", "rows", "queue")[self._rng.randrange(3)]
        q, text, f = self._plant(name)
        if name == "path_in_decision":
            return [{"role": "assistant", "content": text}], 0, q
        lead = "Running it by hand to see the failure." if name == "error_string" else "Checking the live numbers."
        return self._step(lead, [_terminal(_TOOL_CMD[name].format(**f), text, int(name == "error_string"))]), 1, q

    # ---- coding content
    def _hex(self, k: int) -> str:
        return f"{self._rng.getrandbits(4 * k):0{k}x}"

    def _log_lines(self, day: str) -> Iterator[str]:
        """Endless log lines with increasing timestamps on one day (fast: one random() per field)."""
        rnd, bits = self._rng.random, self._rng.getrandbits
        ms = int(rnd() * 86_400_000)
        while True:
            ms += int(rnd() * 4000)
            h, rem = divmod(ms // 1000 % 86400, 3600)
            yield (f"{day}T{h:02d}:{rem // 60:02d}:{rem % 60:02d}.{ms % 1000:03d}Z {_LEVELS[int(rnd() * 20)]} "
                   f"[{_SVC[int(rnd() * 10)]}-{_SVC2[int(rnd() * 8)]}] {_EVENTS[int(rnd() * 6)]} "
                   f"req={bits(48):012x} rows={int(rnd() * 5000)} took={1 + int(rnd() * 3000)}ms")

    def _test_source(self, src: str, fns: Sequence[str]) -> str:
        r, (_, cls, _, fields, _) = self._rng, _TREE[src]
        x = _snake(cls)
        lines = [f'"""Tests for {src}."""', "", "from decimal import Decimal", "", "import pytest", "",
                 f"from {src[:-3].replace('/', '.')} import {cls}, {', '.join(fns)}", "", "", "@pytest.fixture",
                 f"def {x}():", f'    return {cls}({fields[0]}="{fields[0][:3]}_{r.randint(100, 9999)}")']
        for fn in fns:
            for case in r.sample(_CASES, 2):
                lines += ["", "", f"def test_{fn}_{case}({x}):", f"    result = {fn}({x})",
                          "    assert result is not None", f"    assert result.{r.choice(fields)} == "
                          + r.choice(('Decimal("0")', "None", repr(case), str(r.randint(1, 99))))]
        return "\n".join(lines) + "\n"

    def _file(self, path: str) -> str:
        """Current text of a repo file (generated on first use, then kept and patched)."""
        if path in self._files:
            return self._files[path]
        if path.startswith("tests/"):
            src = "src/" + path[6:].replace("test_", "", 1)
            self._files[path] = self._test_source(src, _TREE[src][4])
            return self._files[path]
        r, (doc, cls, table, fields, fns) = self._rng, _TREE[path]
        other, x, const = r.choice(_PATHS), _snake(cls), f"MAX_{fields[2].upper()}"
        lines = [f'"""{doc}"""', "", "from __future__ import annotations", "", "import logging",
                 "from dataclasses import dataclass, field", "from datetime import datetime",
                 "from decimal import Decimal", "", "from src.common.db import transaction",
                 f"from {other[:-3].replace('/', '.')} import {r.choice(_TREE[other][4])}", "",
                 "log = logging.getLogger(__name__)", f"{const} = {r.randint(2, 50)}", "_CACHE: dict[int, object] = {}",
                 "", "", f"class {cls}Error(RuntimeError):", f'    """Raised when a {cls} is inconsistent."""', "", "",
                 "@dataclass", f"class {cls}:", *(f"    {f}: {_ftype(f)}" for f in fields)]
        for fn in fns:
            lines += ["", "", f"def {fn}({x}: {cls}, *, strict: bool = False) -> {cls} | None:",
                      f'    """{fn.replace("_", " ").capitalize()}."""']
            for t in r.sample(_BODY, r.randint(2, 4)):
                f, g = r.sample(fields, 2)
                other_fn = r.choice([o for o in fns if o != fn])
                body = _fill(t, x=x, f=f, g=g, fn=fn, o=other_fn, C=const, t=table, cls=cls)
                lines += ["    " + ln for ln in body.split("\n")]
            lines.append(f"    return {x}")
        self._files[path] = "\n".join(lines) + "\n"
        return self._files[path]

    def _read(self, path: str) -> tuple[str, dict, str]:
        text = self._file(path)
        lines = text.split("\n")[:-1]
        body = "\n".join(f"{i}|{ln}" for i, ln in enumerate(lines, 1))
        result = {"content": body, "total_lines": len(lines), "file_size": len(text), "truncated": False,
                  "is_binary": False, "is_image": False}
        return "read_file", {"path": path}, json.dumps(result)

    def _search(self, pattern: str, paths: list[str]) -> tuple[str, dict, str]:
        matches = [(p, i, ln) for p in dict.fromkeys(paths) for i, ln in enumerate(self._file(p).split("\n"), 1)
                   if pattern in ln]
        res: dict[str, Any] = {"total_count": len(matches)}
        if len(matches) < 5:  # Hermes densifies five or more matches into path-grouped text
            res["matches"] = [{"path": p, "line": i, "content": ln} for p, i, ln in matches]
        else:
            res["matches_format"] = ("path-grouped: each file path on its own line, followed by indented "
                                     "'<line>: <content>' rows for matches in that file")
            res["matches_text"] = "\n".join((f"{p}\n" if j == 0 or matches[j - 1][0] != p else "") + f"  {i}: {ln}"
                                            for j, (p, i, ln) in enumerate(matches))
        return "search_files", {"pattern": pattern, "path": "src" if len(paths) < 3 else "."}, json.dumps(res)

    def _patch(self, path: str, miss: bool = False) -> tuple[str, dict, str]:
        r = self._rng
        lines = self._file(path).split("\n")
        i = r.choice([i for i, ln in enumerate(lines) if ln.startswith("    ") and ln.strip()] or [0])
        old = lines[i]
        if miss:
            args = {"mode": "replace", "path": path, "old_string": old.replace("    ", "  ", 1), "new_string": old}
            return "patch", args, json.dumps({"success": False, "error": f"Could not find a unique match for "
                                              f"old_string in {path}. Re-read the file and include more context."})
        lines[i] = new = _mutate(old, r.choice(_REASONS))
        self._files[path] = "\n".join(lines)
        lo = max(0, i - 3)
        hunk = lines[lo:i + 4]
        diff = [f"--- a/{path}", f"+++ b/{path}", f"@@ -{lo + 1},{len(hunk)} +{lo + 1},{len(hunk)} @@"]
        for j, ln in enumerate(hunk, lo):
            diff += [f"-{old}", f"+{new}"] if j == i else [f" {ln}"]
        args = {"mode": "replace", "path": path, "old_string": old, "new_string": new}
        return "patch", args, json.dumps({"success": True, "diff": "\n".join(diff) + "\n", "files_modified": [path]})

    def _pytest(self, test: str, fail: bool) -> tuple[str, dict, str]:
        r, src = self._rng, "src/" + test[6:].replace("test_", "", 1)
        _, cls, table, fields, fns = _TREE[src]
        total, secs = r.randint(8, 40), f"{r.uniform(0.2, 4):.2f}s"
        if not fail:
            return _terminal(f"pytest -q {test}", f"{'.' * total}{' ' * max(1, 72 - total)}[100%]\n"
                                                  f"{total} passed in {secs}\n")
        fn, case, x = r.choice(fns), r.choice(_CASES), _snake(cls)
        code = [ln.strip() for ln in self._file(src).split("\n") if ln.startswith("    ")] or ["pass"]
        err = _fill(r.choice(_ERRORS), a=f"{r.randint(1, 999)}.{r.randint(0, 99):02d}", b=f"{r.randint(1, 999)}.00",
                    f=r.choice(fields), fn=fn, cls=cls, t=table)
        ln, k = r.randint(12, 140), r.randint(0, total - 1)
        out = (f"{'.' * k}F{'.' * (total - k - 1)}{' ' * max(1, 71 - total)}[100%]\n{'=' * 31} FAILURES {'=' * 31}\n"
               f"{'_' * 20} test_{fn}_{case} {'_' * 20}\n\n"
               f"{x} = {cls}({fields[0]}='{fields[0][:3]}_{r.randint(10, 9999)}')\n\n    def test_{fn}_{case}({x}):\n"
               f">       result = {fn}({x})\n\n{test}:{r.randint(10, 90)}: \n"
               f"{'_ ' * 37}\n\n    def {fn}({x}: {cls}, *, strict: bool = False) -> {cls} | None:\n"
               f">       {code[ln % len(code)]}\nE       {err}\n\n{src}:{ln}: {err.split(':')[0].split('.')[-1]}\n"
               f"{'=' * 25} short test summary info {'=' * 25}\nFAILED {test}::test_{fn}_{case} - {err[:60]}\n"
               f"1 failed, {total - 1} passed in {secs}\n")
        return _terminal(f"pytest -q {test}", out, 1)

    def _git(self) -> tuple[str, dict, str]:
        r = self._rng
        out = "".join(f"{self._hex(7)} {r.choice(('fix', 'feat', 'chore', 'refactor'))}({r.choice(_SVC)}): "
                      f"{r.choice(_BUGS + _FEATURES)} ({r.choice(_AUTHORS)})\n" for _ in range(r.randint(5, 12)))
        return _terminal("git log -12 --format='%h %s (%an)'", out)

    def _big_block(self) -> list[dict]:
        """A tool step whose result (the tool message content) is a 120-200 KB log or JSON dump."""
        r, rnd, bits = self._rng, self._rng.random, self._rng.getrandbits
        size, day = r.randint(120_000, 196_000), f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
        parts, total = [], 0  # escaped length of the output so far
        if r.random() < 0.5:
            for line in self._log_lines(day):
                if total >= size:
                    break
                parts.append(line)
                total += len(line) + 2
            cmd, text, out = f"cat logs/worker-{day}.log", "Reading that day's worker log.", "\n".join(parts) + "\n"
        else:
            while total < size:
                row = (f'{{"id": "le_{bits(64):016x}", "account_id": "acct_{bits(32):08x}", '
                       f'"amount": "{int(rnd() * 18000) - 9000}.{int(rnd() * 100):02d}", "currency": '
                       f'"{("USD", "EUR", "GBP")[int(rnd() * 3)]}", "posted_at": "{day}T{int(rnd() * 24):02d}:'
                       f'{int(rnd() * 60):02d}:00Z", "reference": "{_SVC[int(rnd() * 10)]}/{bits(40):010x}"}}')
                parts.append(row)
                total += len(row) + row.count('"') + 5
            cmd, text = f"python scripts/dump_ledger.py --json --day {day}", "Dumping the ledger for that day."
            out = "[\n  " + ",\n  ".join(parts) + "\n]\n"
        return self._step(text, [_terminal(cmd, out)])

    def _coding_turn(self, preface: str) -> Iterator[list[dict]]:
        """User asks for a fix or feature; explore, reproduce, patch until green, summarise."""
        r = self._rng
        path = r.choice(_PATHS)
        _, cls, _, fields, fns = _TREE[path]
        fn, test = r.choice(fns), "tests/" + path[4:].rsplit("/", 1)[0] + "/test_" + path.rsplit("/", 1)[1]
        ticket = f" (ticket {r.choice(('BILL', 'OPS', 'PAY'))}-{r.randint(10, 999)})" if r.random() < 0.3 else ""
        mode = r.random()
        if mode < 0.5:
            ask = (f"`{fn}` in {path} {r.choice(_SYMPTOMS)} when {r.choice(_CONDITIONS)}. "
                   "Can you find out why and fix it?")
        elif mode < 0.8:
            ask = f"Add {r.choice(_FEATURES)} to {path}. It should go through `{fn}`. Please add tests."
        else:
            ask = f"Run the tests for {path} and fix whatever is failing, then show me the recent history."
        first = _FACTS if self._coding_turns == 0 else ""
        later = r.choice(_LATER) if self._coding_turns > 3 else ""
        self._coding_turns += 1
        yield [{"role": "user", "content": f"{preface}{first}{ask}{ticket} {later}".strip()}]
        kw = {"fn": fn, "path": path, "f": r.choice(fields)}
        calls = [self._search(fn, [path, test] + r.sample(_PATHS, r.randint(0, 2))), self._read(path)]
        calls += [self._read(test)] if r.random() < 0.5 else []
        yield self._step(_fill(r.choice(_EXPLORE), **kw) or None, calls)
        if 0.5 <= mode < 0.8:
            new_test = test.replace(".py", f"_{fn}.py")
            body = self._test_source(path, (fn,))
            yield self._step(f"Adding {new_test} first so the new behaviour is pinned down.", [("write_file",
                             {"path": new_test, "content": body}, json.dumps({"bytes_written": len(body),
                                                                               "dirs_created": False}))])
        yield self._step(r.choice(("Reproducing the failure first.", "Running the current tests.", None)),
                         [self._pytest(test, fail=mode < 0.9)])
        tries = r.choice((1, 1, 1, 2, 2, 3))
        for attempt in range(tries):
            if r.random() < 0.15:
                yield self._step(None, [self._patch(path, miss=True)])
                yield self._step("The patch missed; re-reading the file.", [self._read(path)])
            calls = [self._patch(path)] + ([self._patch(test)] if r.random() < 0.4 else [])
            yield self._step(_fill(r.choice(_FIX), **kw) or None, calls)
            yield self._step(r.choice(("Re-running the tests.", "Checking the fix.", None)),
                             [self._pytest(test, fail=attempt < tries - 1)])
        if mode >= 0.8 or r.random() < 0.25:
            yield self._step(None, [self._git()])
        case = r.choice(_CASES)
        summary = (f"Done. `{fn}` now handles the {case.replace('_', ' ')} case.\n\nChanges:\n- `{path}`: fixed "
                   f"the `{kw['f']}` handling in `{fn}`\n- `{test}`: added `test_{fn}_{case}`\n\n"
                   f"`pytest -q {test}` passes.")
        if r.random() < 0.3:
            summary += (f"\n\nDecision: keep MAX_{fields[2].upper()} in {path} for now and revisit it after the "
                        f"{r.choice(_TABLES)} migration.")
        yield [{"role": "assistant", "content": summary}]

    def _chat_turn(self, preface: str) -> Iterator[list[dict]]:
        """One user message on the current (or a new or resumed) topic and one assistant answer."""
        r = self._rng
        fresh = self._topic is None or r.random() < 0.3
        if fresh or self._topic is None:
            self._topic = r.choice(_TOPIC_NAMES)
            if self._topic not in self._slots or r.random() < 0.3:
                self._slots[self._topic] = {k: r.choice(v) for k, v in _TOPICS[self._topic].items()
                                            if k not in ("open", "follow", "say")}
        name: str = self._topic
        topic = _TOPICS[name]
        slots = {"days": r.randint(3, 10), "k": r.randint(2, 8), "money": r.randint(8, 40) * 10,
                 **self._slots[name]}
        yield [{"role": "user", "content": preface + r.choice(topic["open" if fresh else "follow"]).format(**slots)}]
        said = r.sample(topic["say"], r.randint(2, len(topic["say"])))
        body = "\n".join(f"{i}. {s}" for i, s in enumerate(said, 1)) if r.random() < 0.4 else " ".join(said)
        text = "\n\n".join(p for p in (r.choice(_INTROS), body, r.choice(_CLOSERS)) if p)
        yield [{"role": "assistant", "content": text}]


# --------------------------------------------------------------------------- public builders


def make_session(kind: str, n_messages: int, seed: int = 0, *, repeat_tool_ids: bool = False,
                 final_question: bool = True) -> Session:
    stream = SessionStream(kind, n_messages, seed, repeat_tool_ids=repeat_tool_ids, final_question=final_question)
    messages = list(stream)
    return Session(kind, seed, messages, stream.canaries, stream.final_question)


def coding_session(n_messages: int, seed: int = 0, *, repeat_tool_ids: bool = False,
                   final_question: bool = True) -> Session:
    """A long coding task in the fictional acme-ledger repo, with tool calls and results."""
    return make_session("coding", n_messages, seed, repeat_tool_ids=repeat_tool_ids, final_question=final_question)


def chat_session(n_messages: int, seed: int = 0, *, final_question: bool = True) -> Session:
    """A long multi-topic chat, strictly alternating user/assistant, no tools."""
    return make_session("chat", n_messages, seed, final_question=final_question)


def mixed_session(n_messages: int, seed: int = 0, *, repeat_tool_ids: bool = False,
                  final_question: bool = True) -> Session:
    """Coding turns and chat turns interleaved."""
    return make_session("mixed", n_messages, seed, repeat_tool_ids=repeat_tool_ids, final_question=final_question)


def iter_coding_messages(n_messages: int, seed: int = 0, **kw: Any) -> SessionStream:
    """Lazy form of `coding_session`: iterate the stream, then read `.canaries`."""
    return SessionStream("coding", n_messages, seed, **kw)


def iter_chat_messages(n_messages: int, seed: int = 0, **kw: Any) -> SessionStream:
    return SessionStream("chat", n_messages, seed, **kw)


def iter_mixed_messages(n_messages: int, seed: int = 0, **kw: Any) -> SessionStream:
    return SessionStream("mixed", n_messages, seed, **kw)
