"""Issue #41: the tier-0 stub analysers were made cheaper without changing one byte they output.

The digests below were taken from the code before those changes (main at b05fab2) on a fixed,
generated corpus: the tool results of two generated sessions, and texts mixed from fragments of
every language, log, JSON, YAML, CSV and prose form the analysers tell apart (so each language
gate, salient-line filter and redaction gate meets texts that do and do not hold its words).
A change that alters any stub, kind, exploration sketch, fact line or redaction on this corpus
turns a test red; one that means to change them updates the digest and says why.
"""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from lossless_context.demo.sessions import SessionStream
from lossless_context.pipeline import stubs
from lossless_context.records import MessageRecord
from lossless_context.text import explore as ex
from lossless_context.text.redact import host_available, redact, redact_builtin
from lossless_context.tokens import estimate_message_tokens

_FRAGMENTS = [
    # python
    "def reconcile_day(ledger: Ledger, *, strict: bool = False) -> Ledger | None:", "class LedgerError(RuntimeError):",
    "import os", "from acme.ledger import models", "    elif total < 0:", "    except KeyError as exc:",
    "if __name__ == '__main__':", "        self.total = self.total + amount",
    # javascript / typescript
    "function handle(req, res) {", "const total = items.reduce((a, b) => a + b, 0);", "let x = 1", "var y = 2",
    "module.exports = { handle };", "export default class Widget {", "import React from 'react';",
    "  console.log('done', x)", "const dep = require('lodash')", "export interface Options {", "type Id = string;",
    "  name: string;", "  count: number,", "enum Color { Red, Green }",
    # go
    "package main", "func main() {", "import (", "type Server struct {", "  x := compute(y)", "  fmt.Println(x)",
    # rust
    "pub fn parse(input: &str) -> Result<Ast, Error> {", "let mut buf = Vec::new();", "println!(\"{}\", buf.len());",
    "#[derive(Debug, Clone)]", "impl Display for Ast {", "use std::collections::HashMap;",
    # java / c
    "public static void main(String[] args) {", "import java.util.List;", "package com.acme.ledger;", "@Override",
    "  System.out.println(total);", "#include <stdio.h>", "#define MAX_ROWS 4096", "int main(int argc, char **argv) {",
    "  printf(\"%d\\n\", n);", "  node->next = NULL;", "  std::vector<int> v;",
    # shell / ruby / php / sql / html
    "#!/bin/bash", "set -euo pipefail", "if [ -f \"$CONFIG\" ]; then", "  echo \"building $TARGET\"", "fi", "done",
    "export PATH=/usr/local/bin:$PATH", "def save!", "end", "require 'json'", "module Ledger", "  attr_reader :total",
    "<?php", "  $this->total = 0;", "public function save($row) {", "SELECT id, total FROM ledger WHERE day = 3;",
    "insert into ledger values (1, 2);", "CREATE TABLE ledger (id int);", "ALTER TABLE ledger ADD col int;",
    "<!DOCTYPE html>", "<div class=\"row\">", "<body>",
    # logs
    "2026-11-02T10:15:03 INFO worker started pid=4411", "2026-11-02 10:15:04 ERROR failed to open /var/data/x.db",
    "[2026-11-02 10:15:05] WARN retrying in 250 ms", "Nov  2 10:15:06 host sshd[812]: Accepted publickey",
    "10:15:07.123 DEBUG cache hit ratio 0.93", "level=error msg=\"upstream timeout\" service=billing-api",
    "Traceback (most recent call last):", "  File \"acme/ledger/day.py\", line 88, in reconcile_day",
    "ValueError: negative balance on 2026-11-02", "FAILED tests/test_day.py::test_reconcile - AssertionError",
    "error: could not compile `ledger` (exit code 101)", "panic: runtime error: index out of range",
    "INFO worker ready", "DEBUG x=1", "TRACE enter", "CRITICAL disk full", "WARNING low space",
    "Segmentation fault (core dumped)", "npm ERR_SOCKET_TIMEOUT while fetching", "fatal: not a git repository",
    # yaml / csv / json-ish / prose / facts
    "---", "name: ledger", "  replicas: 3", "- item: one", "# a comment", "id,day,total,currency",
    "1,2026-11-02,1200,EUR", "2\t2026-11-03\t800\tUSD", "{\"ok\": true, \"rows\": 12}", "[1, 2, 3]",
    "The reconciliation finished and every account balanced.", "See https://example.org/docs/ledger for details.",
    "## Results", "commit 3f9a2c1d7e and request 0f8e7d6c-5b4a-4321-9fed-cba987654321 both failed.",
    "ticket LEDGER-4821 moved; BUILD_ID=ACME_RC_2 copied 12,345 rows in 1.5 s", "src/acme/ledger/day.py:88",
    "wrote ../out/report.json and ./tmp/cache.bin", "made reconcileDay and reconcile_day() agree",
    # secrets (redaction's gates)
    "api_key = \"sk-proj-AbCdEf0123456789ZyXwVuT\"", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abcDEF123",
    "password: hunter2hunter2", "postgres://app:s3cretPass99@db.internal:5432/ledger", "token=ghp_0123456789abcdefABCDEF0123",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "x-api-key: 9f8e7d6c5b4a39281706f5e4d3c2b1a0",
    # edges: long lines (salient words past 400 chars), non-ASCII, control characters, tabs
    "x" * 395 + " src/app.py " + "y" * 40, "z" * 420 + " Traceback here", "w" * 398 + ".py" + " tail",
    "caf\u00e9 na\u00efve \u00fcber \u2014 \u4e2d\u6587 \u017felect K", "bell\x07 and nul\x00 here", "\tindented\twith\ttabs",
    "", "   ",
]
_HINTS = [None, "terminal", "read_file", "src/app.py", "main.go", "lib.rs", "App.java", "run.sh", "data.json",
          "conf.yaml", "rows.csv", "server.log", "index.ts", "x.c", "json", "logs"]


def _mixed_texts(n: int, seed: int) -> list[tuple[str, str | None]]:
    rng = random.Random(f"lcm-stub-pin/{seed}")
    out = []
    for _ in range(n):
        k = rng.choice((3, 6, 12, 30, 80, 200))
        lines = [rng.choice(_FRAGMENTS) for _ in range(k)]
        if rng.random() < 0.3:  # mostly one language: what a real file looks like
            block = rng.randrange(0, len(_FRAGMENTS) - 8)
            lines = [rng.choice(_FRAGMENTS[block:block + 8]) for _ in range(k)] + lines[: k // 4]
        text = "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")
        if rng.random() < 0.1:
            text = json.dumps({"output": text, "exit_code": rng.choice((0, 1, 2)), "error": rng.choice(("", "boom"))})
        out.append((text, rng.choice(_HINTS)))
    return out


def _session_results() -> list[tuple[str, tuple[str, str] | None]]:
    out = []
    for kind, n, seed in (("coding", 1500, 5), ("mixed", 600, 2)):
        calls: dict[str, tuple[str, str]] = {}
        for m in SessionStream(kind, n, seed):
            for tc in m.get("tool_calls") or ():
                calls[tc["id"]] = (tc["function"]["name"], tc["function"]["arguments"])
            if m.get("role") == "tool" and isinstance(m.get("content"), str):
                out.append((m["content"], calls.get(m.get("tool_call_id") or "")))
    return out


def _corpus() -> list[tuple[str, tuple[str, str] | None]]:
    mixed = [(t, None if h is None else (h, json.dumps({"path": h}) if "." in h else "{}"))
             for t, h in _mixed_texts(400, 1)]
    return _session_results() + mixed


def _summaries() -> list[str]:
    """Extractive summaries of windows of two generated sessions (leaf-like), and of those
    summaries (condensed-like: their lines come back), with and without a focus."""
    from lossless_context.records import Source
    from lossless_context.summarizers.extractive import extractive_summary

    msgs = [m for kind, n, seed in (("coding", 900, 7), ("mixed", 400, 3)) for m in SessionStream(kind, n, seed)]
    leaves: list[str] = []
    out: list[str] = []
    for w in range(0, len(msgs), 40):
        sources = [Source(f"m{w + k}", m.get("role", "?"), m.get("content") or json.dumps(m.get("tool_calls")), None)
                   for k, m in enumerate(msgs[w:w + 40])]
        for target, focus in ((120, None), (400, None), (400, "ledger reconcile")):
            out.append(extractive_summary(sources, target, focus=focus))
        leaves.append(out[-2])
    for w in range(0, len(leaves), 4):
        sources = [Source(f"s{w + k}", "summary", t, None) for k, t in enumerate(leaves[w:w + 4])]
        out.append(extractive_summary(sources, 300))
        out.append(extractive_summary(sources, 300, aggressive=True))
    return out


def test_extractive_summaries_match_the_code_before_the_speedups():
    assert _digest(_summaries()) == PINNED_SUMMARIES


def _digest(values: list) -> str:
    return hashlib.sha256(repr(values).encode("utf-8", "surrogatepass")).hexdigest()


@pytest.fixture(scope="module")
def corpus():
    return _corpus()


PINNED = {
    "classify": "386f6c36ba7fba277e8b6bf9ca36cf64c9fdc1c8a5d7f619234218afda206d8d",
    "explore": "53e446c827f8cba6f17c0a1d09ea64b544588b89cad1836261e54846d0c72700",
    "facts": "dc652b92f2c8739cca63ba87ed4e5be7c5c4c1daa41765b04e46e5cf7e914ad5",
    "error_lines": "4ec9cc366e2cf965ea08fcaa444f31576a61a08c8a5dee0f983597e35988ac58",
    "make_stub": "1b5f29872cd1b98b0d9fd5578ea04fa015cb9864a1af2bdd4d24eff6728ae237",
    "stub_for": "aeb33d67e7998ea1ff541b289da75b19326547b4772b99d052e6d567bdd79d6f",
    "redact_builtin": "16ace9c5dec5bc7af24dc613e279fdbfdcba59acfeac873d4889c794f62bf7ef",
    "stub_for_default": "5509000967d723bb073bcdbfcabbd6ecaac23c589499a84a675d054f6bb42274",
    "redact_host": "84a150ac5d710c569514a38f7c1c69af78293f2dfef8ae17c62239fb5d84a83f",
}

PINNED_SUMMARIES = "ba5df85e8430cf335ac1713de6e31c86d3a862425fb5527b1ceec40d48a0c0cd"


def _outputs(corpus) -> dict[str, list]:
    policy = stubs.StubPolicy()
    small = stubs.StubPolicy(stub_tokens=120, head_lines=1, tail_lines=1, redact=False)
    out: dict[str, list] = {k: [] for k in PINNED}
    for i, (text, call) in enumerate(corpus):
        hint = stubs._path_hint(call)
        body, _ = stubs._body_text(text)
        out["classify"].append(ex.classify(body, hint)[0])
        out["explore"].append([ex.explore(body, t, hint) for t in (40, 150, 600)])
        out["facts"].append([stubs._facts(body, b, code) for b in (120, 600) for code in (False, True)])
        out["error_lines"].append(stubs.error_lines(body.split("\n")))
        made = [stubs.make_stub(text, call, p) for p in (policy, small)]
        out["make_stub"].append(made)
        msg = {"role": "tool", "tool_call_id": f"c{i}", "content": text}
        rec = MessageRecord(id=i + 1, session_id="s", seq=i, uid=None, ident=f"i{i}", role="tool", raw=msg,
                            text=text, tokens=estimate_message_tokens(msg), created_at=0.0)
        out["stub_for"].append(stubs.stub_for(rec, msg, call, small))
        out["stub_for_default"].append(stubs.stub_for(rec, msg, call, policy))  # (same text, another policy)
        out["redact_builtin"].append([redact_builtin(m) for m in made] + [redact_builtin(text)])
        if host_available():
            out["redact_host"].append([redact(m) for m in made])
    return out


@pytest.fixture(scope="module")
def outputs(corpus):
    return _outputs(corpus)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_outputs_match_the_code_before_the_speedups(outputs, name):
    if name == "redact_host" and not host_available():
        pytest.skip("the host's redactor is not installed")
    assert outputs[name], "the corpus gave this analyser nothing to do"
    assert _digest(outputs[name]) == PINNED[name], f"{name}: output changed on the pinned corpus"


def test_corpus_reaches_every_kind_and_gate(corpus, outputs):
    """The corpus is only worth pinning if it exercises the branches the speedups touch."""
    kinds = set(outputs["classify"])
    for want in ("json", "yaml", "csv", "log", "text", "code:python", "code:go", "code:c", "code:shell"):
        assert want in kinds, want
    assert any("salient lines:" in e[2] for e in outputs["explore"])
    assert any("[REDACTED" in r[-1] for r in outputs["redact_builtin"])
    assert sum(s is not None for s in outputs["stub_for"]) > 100
    assert sum(s is None for s in outputs["stub_for"]) > 10


def _gate_texts() -> list[str]:
    """Each fragment alone, glued to its neighbours, and inside prose: a gate that misses one
    literal of its pattern meets a text whose only match needs that literal."""
    out = []
    for i, f in enumerate(_FRAGMENTS):
        nxt = _FRAGMENTS[(i + 1) % len(_FRAGMENTS)]
        out += [f, f + "\n" + nxt, "some words first\n" + f + "\nand after", f.upper(), f.lower()]
    return out


def test_language_gates_never_skip_a_match():
    for text in _gate_texts():
        for lang, rx in ex._LANG_SIGNS.items():
            assert ex._lang_count(lang, text) == len(rx.findall(text)), (lang, text)


def test_log_gate_never_skips_a_level_word():
    def looks_log(lines):  # (the definition)
        hits = sum(1 for ln in lines if ex._TS_RE.match(ln) or ex._LEVEL_RE.search(ln))
        stamped = sum(1 for ln in lines if ex._TS_RE.match(ln))
        return (hits >= 3 and hits >= 0.4 * len(lines)) or (0 < len(lines) <= 2 and stamped == len(lines))

    texts = _gate_texts() + [text for text, _ in _mixed_texts(80, 4)]
    for text in texts:
        for k in (1, 2, 3, 5, 20):
            lines = [ln for ln in text.split("\n") if ln.strip()][:k] * 3
            assert ex._looks_log(lines) == looks_log(lines), lines


def test_redaction_gates_pick_the_families_present():
    from lossless_context.text import redact as rd

    texts = _gate_texts() + [text for text, _ in _mixed_texts(60, 3)]
    for families in (rd._TOKEN_FAMILIES, rd._KEY_ANCHORS, rd._HOST_TRIGGERS):
        gates = [g for fam in families for g in fam[0]]
        for text in texts + gates + [" ".join(gates[::3]), " ".join(gates[1::2])]:
            want = tuple(fam[1] for fam in families if any(g in text for g in fam[0]))  # (the definition)
            got = rd._regex_for(text, families, rd._flatten(families))
            assert (got.pattern if got is not None else None) == ("|".join(want) if want else None), text


def _path_texts() -> list[str]:
    """Texts whose path matches sit against every kind of edge: whitespace of each sort (the
    ones str.split() cuts at but a regex's \\s may not, and the reverse), punctuation glued to
    a path, paths at the text's ends, dots and slashes alone."""
    rng = random.Random("lcm-path-words")
    parts = ["src/acme/ledger/day.py", "./run.sh", "../out/report.json", "/var/data/x.db", "a.py", "x.c", "README.md",
             "day.pyc", "conf.yaml", "v1.2.3", "end.", "/", ".", "..", "-", "a/b", "dir/", "/usr/local/bin:$PATH",
             "café/naïve.md", "中文/文件.json", "(see lib/util.go)", "\"tests/test_day.py::test_x\"", "e.g.", "x-y.toml",
             "f(a.b)", "path=src/app.py,", "http://example.org/docs/ledger.html"]
    seps = [" ", "\n", "\t", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u2028",
            "\u3000", "\u200b", ",", ";", ":", "(", ")", "", "\"", "'", "`", "|", "=", "\x00"]
    out = [text for text, _ in _mixed_texts(120, 6)] + _gate_texts() + parts
    for _ in range(3000):
        out.append("".join(rng.choice(parts) + rng.choice(seps) for _ in range(rng.randrange(1, 8))))
    return out


def test_path_words_find_what_the_path_patterns_find():
    texts = _path_texts()
    assert sum(bool(stubs._PATH_EXT_RE.search(t)) for t in texts) > 1000  # (the corpus has paths to find)
    for text in texts:
        for rx in (stubs._PATH_RE, stubs._PATH_EXT_RE):
            assert list(stubs.path_matches(text, rx)) == [m.group(0) for m in rx.finditer(text)], (rx.pattern, text)


def test_salient_is_a_score_of_three_or_more():
    """_describe_text keeps the lines _salient picks (all of them, up to 40): exactly the lines
    whose _SALIENT score is 3 or more; and the pinned corpus has texts with more than 40 such
    lines (where the scores rank them) and texts with fewer."""
    lines = [ln for text in _path_texts() + [t for t, _ in _mixed_texts(200, 7)] for ln in text.split("\n")]
    lines += [f + " " + g for f in _FRAGMENTS for g in ("", "#", "## x", "see http://x", "a_b", "x1", "http://a b")]
    lines += [f"it {w} here" for w in ("Error", "Exception", "Traceback", "error:", "failed", "FAIL", "fatal", "panic")]
    lines += ["x" * 397 + w for w in ("panic", "/a/", ".py", "FAIL")]  # (a match that ends past 400: no match)
    lines += ["see https://x", "see https://x 1", "https://x aB", "https://x a_b", "go http://x f()", "# x", "#x"]
    for line in lines:
        assert ex._salient(line) == (sum(w for rx, w in ex._SALIENT if rx.search(line, 0, 400)) >= 3), line
    counts = [sum(map(ex._salient, text.split("\n"))) for text, _ in _corpus()]
    assert any(n > 45 for n in counts) and any(3 <= n < 38 for n in counts)


def test_id_pattern_finds_what_its_definition_finds():
    """stubs._ID_RE is the definition below rewritten to start with a character set."""
    import re

    definition = re.compile(r"\b[A-Z][A-Z0-9]*(?:[-_][A-Z0-9]+)+\b|\b[0-9a-f]{7,40}\b|"
                            r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
    rng = random.Random("lcm-ids")
    ids = ["LEDGER-4821", "BUILD_ID", "ACME_RC_2", "A-B", "A_", "AB-", "X-1-Y", "Ab-C", "3f9a2c1", "3f9a2c1d7e",
           "abcdef", "abcdefa", "a" * 40, "a" * 41, "0" * 7, "deadbeefcafe", "0f8e7d6c-5b4a-4321-9fed-cba987654321",
           "0f8e7d6c-5b4a-4321-9fed-cba98765432", "0f8e7d6c-5b4a-4321-9fed-cba987654321a", "face", "added", "É-1",
           "ÄB-C", "éabcdef0", "_abcdef0", "x3f9a2c1", "F00D-BEEF"]
    seps = [" ", "", "-", "_", ".", "/", "\n", "é", "x", "A", "0", "(", "\u00a0"]
    texts = [text for text, _ in _corpus()[::3]] + _path_texts()[::4] + ids
    for _ in range(4000):
        texts.append("".join(rng.choice(ids) + rng.choice(seps) for _ in range(rng.randrange(1, 6))))
    found = 0
    for text in texts:
        want = [m.span() for m in definition.finditer(text)]
        assert [m.span() for m in stubs._ID_RE.finditer(text)] == want, text
        found += bool(want)
    assert found > 2000


def _line_lists() -> list[list[str]]:
    """Lines as classify hands them over: of every mixed text and gate text, cut at several
    lengths, plus delimited and YAML-ish tables (prose-like ones too) of each delimiter."""
    rng = random.Random("lcm-line-lists")
    texts = [text for text, _ in _mixed_texts(150, 8)] + _gate_texts()
    for _ in range(400):
        delim = rng.choice(("\t", ",", ";", "|", ": ", " "))
        width = rng.randrange(1, 5)
        rows = [delim.join(rng.choice(("a", "1", "x y", "z.", "k:", "# c", "- i", "b?")) for _ in range(width))
                + rng.choice(("", "", ".", ":", "!", delim)) for _ in range(rng.randrange(1, 50))]
        if rng.random() < 0.3:
            rows.insert(rng.randrange(0, len(rows) + 1), rng.choice(("---", "# note", "key: v", "  nested: 1")))
        texts.append("\n".join(rows))
    out = []
    for text in texts:
        lines = [ln for ln in text.split("\n") if ln.strip()]
        out += [lines[:k] for k in (1, 2, 3, 5, 41, 200)]
    return out


def test_csv_and_yaml_tests_decide_as_their_definitions():
    def csv_delimiter(lines):  # (the definition)
        if len(lines) < 2:
            return None
        prose = sum(1 for ln in lines[:40] if ln.rstrip()[-1:] in ".!?:") >= 0.5 * min(len(lines), 40)
        for delim, need in (("\t", 2), (",", 3), (";", 3), ("|", 3)):
            counts = [ln.count(delim) for ln in lines[:40]]
            if len(counts) < need or counts[0] == 0:
                continue
            same = sum(1 for c in counts if c == counts[0])
            if same >= need and same >= 0.8 * len(counts) and not (prose and delim != "\t"):
                return delim
        return None

    def looks_yaml(lines):  # (the definition)
        content = [ln for ln in lines if not ln.lstrip().startswith("#")]
        if not content:
            return False
        if content[0].strip() == "---" and len(content) > 1:
            return True
        keyish = sum(1 for ln in content if ex._YAML_LINE_RE.match(ln))
        top = sum(1 for ln in content if ln[:1] not in " \t-" and ex._YAML_TOP_RE.match(ln))
        return len(content) >= 2 and keyish >= 0.7 * len(content) and top >= 1 and (top >= 2 or len(content) >= 3)

    found = {"csv": set(), "yaml": 0, "prose": 0}
    for lines in _line_lists():
        want = csv_delimiter(lines)
        assert ex._csv_delimiter(lines) == want, lines
        found["csv"].add(want)
        y = looks_yaml(lines)
        assert ex._looks_yaml(lines) == y, lines
        found["yaml"] += y
    assert found["csv"] == {None, "\t", ",", ";", "|"} and found["yaml"] > 20


def test_token_gate_finds_a_gate_exactly_when_one_is_present():
    # _TOKEN_GATES is a trie of the token families' gates: a text holds one iff it matches.
    from lossless_context.text import redact as rd

    gates = [g for g, _ in rd._TOKEN_KINDS]
    near = [g[:-1] for g in gates] + [g[1:] for g in gates] + [g.swapcase() for g in gates]
    texts = _gate_texts() + [text for text, _ in _mixed_texts(60, 3)] + gates + near
    texts += [" ".join(gates), "".join(near), "x" + "".join(g[:-1] + "!" for g in gates)]
    for text in texts:
        assert (rd._TOKEN_GATES.search(text) is not None) == any(g in text for g in gates), text


def test_any_literal_regex_matches_its_definition():
    # Literals over a small alphabet share prefixes, hold one another and overlap in a text.
    from lossless_context.text.redact import _any_literal_re

    rnd = random.Random(41)
    for _ in range(300):
        lits = tuple({"".join(rnd.choice("ab_-.") for _ in range(rnd.randint(1, 4))) for _ in range(rnd.randint(1, 6))})
        rx = _any_literal_re(lits)
        for _ in range(20):
            text = "".join(rnd.choice("ab_-.x") for _ in range(rnd.randint(0, 12)))
            assert (rx.search(text) is not None) == any(w in text for w in lits), (lits, text)


def test_summary_node_ids_of_a_string_without_the_marker():
    # summary_node_ids leaves a string without the marker at once; it must still find what the
    # flattened text holds (NULs dropped can join a marker; a lone surrogate is repaired).
    from lossless_context.messages import SUMMARY_MARKER_RE, flatten_content, summary_node_ids

    def definition(msg):  # (the code before the shortcut)
        m = SUMMARY_MARKER_RE.search(flatten_content(msg.get("content")))
        if not m:
            return []
        return [int(t.strip()[1:]) for t in m.group(1).split(",") if t.strip().startswith("s") and t.strip()[1:].isdigit()]

    contents = ['<lcm-summary nodes="s12,s3">x', '<lcm-summ\x00ary nodes="s7">', '<lcm-summary nodes="s\x005">',
                'pre \ud800 <lcm-summary nodes="s9">', "no marker", "", "\x00", '<lcm-summary nodes="">',
                [{"type": "text", "text": '<lcm-summary nodes="s4">'}], None, {"text_summary": '<lcm-summary nodes="s8">'}]
    for c in contents:
        msg = {"role": "user", "content": c}
        assert summary_node_ids(msg) == definition(msg), c
    assert summary_node_ids({"role": "user", "content": '<lcm-summ\x00ary nodes="s7">'}) == [7]


def test_number_unit_pattern_finds_what_its_definition_finds():
    # extractive._NUM_UNIT_RE's digit runs are possessive: the same match (span) as the
    # pattern with backtracking runs, on every line of the corpus and on digit-dense strings.
    import re

    from lossless_context.summarizers import extractive as xs

    definition = re.compile(
        r"\d+(?:[.,]\d+)?\s?(?:ms|s|secs?|seconds?|minutes?|mins?|h|hrs?|hours?|days?|[KMGT]i?B|"
        r"[kmg]b|bytes?|%|px|rps|qps|req/s|tokens?|lines?|files?|x|GHz|MHz)(?![A-Za-z])"
        r"|\d+\.\d+\.\d+")
    rnd = random.Random(41)
    texts = [ln for t in _gate_texts() + [text for text, _ in _mixed_texts(60, 3)] for ln in t.split("\n")]
    texts += ["v 1.2.3 x", "3.11.7", "10.5 ms", "1,000 tokens", "1.5x", "2.0.1ms", "12345678901234567890 s",
              "2026-11-02T10:15:03", "9 GHz", "7.x", "1..2 ms"]
    texts += ["".join(rnd.choice("0123456789..,, msxkbhB%") for _ in range(rnd.randint(0, 16))) for _ in range(20_000)]
    texts += ["".join(rnd.choice("0123456789.,  msxhKiBkb%/reqMHzGlinestokfy-") for _ in range(rnd.randint(0, 24)))
              for _ in range(10_000)]
    for text in texts:
        a, b = definition.search(text), xs._NUM_UNIT_RE.search(text)
        assert (a.span() if a else None) == (b.span() if b else None), text


def _facts_by_definition(text: str, budget_chars: int, code: bool = False) -> list[str]:
    """stubs._facts as it was before it stopped at the cut: every value up to 16 collected,
    then the line cut."""
    sample = text if len(text) <= 400_000 else text[:200_000] + "\n" + text[-200_000:]
    out: list[str] = []
    paths = stubs._PATH_RE if "/" in sample else stubs._PATH_EXT_RE
    for label, rx in (("paths", paths), ("ids", stubs._ID_RE), ("numbers", stubs._NUM_RE)):
        if label == "numbers" and code:
            continue
        seen: dict[str, None] = {}
        for m in rx.finditer(sample):
            v = m.group(0).strip(".,")
            if label == "numbers" and len(v) - v.count(",") - v.count("_") - v.count(".") < 3:
                continue
            if len(v) >= 2 and v not in seen:
                seen[v] = None
                if len(seen) >= 16:
                    break
        if seen:
            line = f"{label}: " + ", ".join(stubs._cap(v, 120) for v in seen)
            out.append(stubs._cap(line, max(60, budget_chars // 3)))
    return out


def test_facts_stop_where_the_line_is_cut():
    """_facts stops collecting values once its line is longer than the cut: the same lines
    as collecting them all (up to 16) and cutting, at every budget."""
    texts = [stubs._body_text(t)[0] for t, _ in _corpus()] + _path_texts()[:600]
    texts += [" ".join(f"/srv/app{k}/mod_{k}.py LEDGER-{k:04d} {k * 7919:,}" for k in range(n)) for n in range(1, 30)]
    texts += ["x" * 100 + "/" + "y" * 200 + " a/b 12345 " * 3, "a/b " + "c" * 130 + "/d.py 9999"]
    stopped = 0
    for text in texts:
        for budget in (0, 120, 180, 183, 186, 250, 400, 600, 1500):
            for code in (False, True):
                assert stubs._facts(text, budget, code) == _facts_by_definition(text, budget, code), (text[:200], budget)
        stopped += any(ln.endswith("\u2026") for ln in stubs._facts(text, 120))
    assert stopped > 50  # (the corpus has lines that are cut)


def test_nonempty_ends_are_the_ends_of_the_nonblank_lines():
    rng = random.Random(11)
    for _ in range(3000):
        lines = [rng.choice(["", " ", "\t", "a", " b ", "c\u2028", "\u3000"]) for _ in range(rng.randrange(0, 9))]
        nonempty = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
        for n in range(0, 5):
            assert stubs._nonempty_ends(lines, n, False) == nonempty[:n]
            assert stubs._nonempty_ends(lines, n, True) == (nonempty[-n:] if n else [])
