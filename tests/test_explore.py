"""Tests for lossless_context.text.explore: detection, per-kind descriptions, bounds, hostile input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossless_context.text.explore import detect_kind, explore


def est(text: str) -> int:
    return (len(text) + 3) // 4


USERS_JSON = json.dumps({
    "users": [{"id": i, "name": f"user{i}", "email": f"u{i}@example.com", "roles": ["admin", "dev"],
               "profile": {"age": 30 + i, "active": True, "tags": ["x"]}} for i in range(250)],
    "total": 250,
    "page": {"number": 1, "size": 250},
    "next_cursor": None,
}, indent=2)

K8S_YAML = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels:
    app: web
spec:
  replicas: 3
  template:
    spec:
      containers:
        - name: web
          image: nginx:1.25
---
apiVersion: v1
kind: Service
metadata:
  name: web
ports:
  - 80
  - 443
"""

CSV_TEXT = "id,name,price,qty\n" + "".join(f"{i},item{i},{i * 1.5:.2f},{i % 7}\n" for i in range(1, 501))

PY_CODE = '''\
import os
from typing import Any


class Store:
    """A tiny store."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def load(self, key: str) -> Any:
        return None


def helper(x):
    return x * 2
'''

JS_CODE = """\
import fs from 'fs';
const path = require('path');

export function readConfig(name) {
  return fs.readFileSync(path.join('cfg', name));
}

class Cache {
  constructor() { this.items = {}; }
  async refresh(key) {
    if (key) { return 1; }
  }
}

const double = (x) => x * 2;
"""

TS_CODE = """\
export interface User { id: number; name: string; }
export type Id = string;
export function getUser(id: Id): User { return { id: 1, name: 'a' }; }
export class Repo { find(id: string): User | null { return null; } }
"""

GO_CODE = """\
package main

import (
\t"fmt"
\t"os"
)

type Server struct {
\tport int
}

func (s *Server) Start() error {
\tfmt.Println(s.port)
\treturn nil
}

func main() {
\tos.Exit(0)
}
"""

RUST_CODE = """\
use std::collections::HashMap;

pub struct Cache { items: HashMap<String, u32> }

impl Cache {
    pub fn new() -> Self { Cache { items: HashMap::new() } }
}

fn main() {
    let mut c = Cache::new();
    println!("{}", c.items.len());
}
"""

JAVA_CODE = """\
package com.example;

import java.util.List;

public class OrderService {
    @Override
    public String toString() { return "x"; }

    public List<String> listOrders(int limit) {
        System.out.println(limit);
        return null;
    }
}
"""

C_CODE = """\
#include <stdio.h>
#include "util.h"
#define MAX_ITEMS 64

struct item {
    int id;
};

static int count_items(struct item *items, int n)
{
    return n;
}

int main(void)
{
    printf("%d\\n", count_items(NULL, 0));
    return 0;
}
"""

SHELL_CODE = """\
#!/usr/bin/env bash
set -euo pipefail
source ./lib.sh

build() {
  echo "building"
}

function deploy {
  build
}

if [ -n "${CI:-}" ]; then
  deploy
fi
"""

LOG_TEXT = "".join(
    f"2024-05-01 12:{i // 60 % 60:02d}:{i % 60:02d} "
    + ("ERROR [db] connection refused on port 5432\n" if i % 100 == 7 else
       "WARN [api] slow response 2300 ms\n" if i % 50 == 3 else
       f"INFO [worker-{i % 3}] processed batch {i}\n")
    for i in range(1000)
) + "2024-05-01 12:16:40 ERROR [auth] token signature invalid for user 42\n"

PROSE = (
    "# Migration notes\n\nWe moved the billing service last week.\n\n"
    + "The meeting covered general topics and nothing specific was decided there.\n" * 60
    + "## Open problems\nThe importer failed with Error: missing column in /srv/import/schema.sql\n"
    + "Other remarks follow in a calm and uneventful tone.\n" * 60
    + "Final words: see you next week.\n"
)


@pytest.mark.parametrize("text,hint,kind", [
    (USERS_JSON, None, "json"),
    ('{"a": [1, 2, {"b": null}]}', None, "json"),
    ("[1, 2, 3]", None, "json"),
    ('{"a": 1}\n{"a": 2}\n{"a": 3}\n', None, "json"),
    ('{"a": 1, "b": [1, 2', None, "json"),
    (K8S_YAML, None, "yaml"),
    ("name: x\nversion: 2\ndeps:\n  - a\n  - b\n", None, "yaml"),
    (CSV_TEXT, None, "csv"),
    ("a;b;c\n1;2;3\n4;5;6\n7;8;9\n", None, "csv"),
    ("a\tb\tc\n1\t2\t3\n4\t5\t6\n", None, "tsv"),
    (PY_CODE, None, "code:python"),
    (JS_CODE, None, "code:javascript"),
    (TS_CODE, None, "code:typescript"),
    (GO_CODE, None, "code:go"),
    (RUST_CODE, None, "code:rust"),
    (JAVA_CODE, None, "code:java"),
    (C_CODE, None, "code:c"),
    (SHELL_CODE, None, "code:shell"),
    (LOG_TEXT, None, "log"),
    ("[2024-05-01 12:00:00] INFO up\n[2024-05-01 12:00:01] ERROR down\n[2024-05-01 12:00:02] INFO up\n", None, "log"),
    (PROSE, None, "text"),
    ("Lorem ipsum, dolor sit amet, consectetur.\n" * 50, None, "text"),
    ("", None, "text"),
    ("x = 1\n", "script.py", "code:python"),
    ("a: 1\n", "values.yaml", "yaml"),
    ("whatever", "out.log", "log"),
    ('{"k": 1}', "weird.yaml", "json"),
    ("\x00\x01\x02\x03binary" * 50, None, "text"),
])
def test_detect_kind(text: str, hint: str | None, kind: str) -> None:
    assert detect_kind(text, hint) == kind


def test_always_states_kind_and_size() -> None:
    out = explore(USERS_JSON, 600)
    first = out.split("\n", 1)[0]
    assert "kind: json" in first
    assert f"{len(USERS_JSON):,} chars" in first
    assert f"{USERS_JSON.count(chr(10)) + 1:,} lines" in first
    assert f"~{est(USERS_JSON):,} tokens" in first
    assert "(hint: api.json)" in explore(USERS_JSON, 600, hint="api.json")


def test_json_description() -> None:
    out = explore(USERS_JSON, 600)
    assert "top level: object (4 keys)" in out
    assert "users: array[250] of object" in out
    for key in ("id", "name", "email", "roles", "profile", "total", "page", "next_cursor"):
        assert re.search(rf"\b{key}\b", out), key
    assert "total: int = 250" in out  # a sample value
    assert "age: int = 30" in out  # depth 3 shape
    assert '"admin"' in out


def test_json_top_level_array_and_lines() -> None:
    out = explore(json.dumps([{"ts": i, "event": "click"} for i in range(1000)]), 300)
    assert "array[1,000] of object" in out and "event" in out
    jl = "\n".join(json.dumps({"ts": i, "user": {"id": i}}) for i in range(400))
    out = explore(jl, 300)
    assert "JSON lines: ~400 records" in out and "user" in out and "ts" in out


def test_invalid_json_is_scanned() -> None:
    text = '{"alpha": 1, "beta": {"x": [1, 2, 3]}, "gamma": "unterminated'
    out = explore(text, 300)
    assert "kind: json" in out and "JSON not parsed" in out
    for key in ("alpha", "beta", "gamma"):
        assert key in out
    arr = "[" + ",".join(json.dumps({"id": i, "name": "n"}) for i in range(100)) + ",{"
    out = explore(arr, 300)
    assert "top level: array" in out and "first item keys: id, name" in out


def test_deeply_nested_json_does_not_raise() -> None:
    text = "[" * 200_000 + "]" * 200_000
    out = explore(text, 200)
    assert "kind: json" in out and est(out) <= 200


def test_yaml_description() -> None:
    out = explore(K8S_YAML, 600)
    assert "YAML: 2 documents" in out
    assert "kinds: Deployment x1, Service x1" in out
    assert "L1 apiVersion: apps/v1" in out
    assert "L3 metadata: mapping {name, labels}" in out
    assert "L7 spec: mapping {replicas, template}" in out
    assert "ports: list of 2 items" in out


def test_csv_description() -> None:
    out = explore(CSV_TEXT, 600)
    assert "CSV: delimiter ',', 4 columns, 500 data rows" in out
    assert "columns: id, name, price, qty" in out
    assert "price: number, 1.5 .. 750" in out
    assert "first row: 1,item1,1.50,1" in out
    assert "last row: 500,item500,750.00,3" in out
    tsv = explore("city\tpop\nOslo\t700000\nBergen\t285000\n", 200)
    assert "TSV: delimiter tab, 2 columns, 2 data rows" in tsv and "pop: number, 285000 .. 700000" in tsv


def test_python_definitions_with_line_numbers() -> None:
    out = explore(PY_CODE, 600)
    assert "language: python" in out
    assert "imports: os, typing" in out
    assert "L5 class Store:" in out
    assert "L8 def Store.__init__(self, path: str) -> None:" in out
    assert "L11 async def Store.load(self, key: str) -> Any:" in out
    assert "L15 def helper(x):" in out


@pytest.mark.parametrize("code,lang,needles", [
    (JS_CODE, "javascript", ["imports: fs, path", "L4 export function readConfig(name) {", "L8 class Cache {",
                             "L10 async refresh(key) {", "L15 const double = (x) => x * 2;"]),
    (TS_CODE, "typescript", ["L1 export interface User", "L2 export type Id", "L3 export function getUser",
                             "L4 export class Repo"]),
    (GO_CODE, "go", ["imports: fmt, os", "L8 type Server struct {", "L12 func (s *Server) Start() error {",
                     "L17 func main() {"]),
    (RUST_CODE, "rust", ["imports: std::collections::HashMap", "L3 pub struct Cache", "L5 impl Cache {",
                         "L6 pub fn new() -> Self", "L9 fn main() {"]),
    (JAVA_CODE, "java", ["imports: java.util.List", "L5 public class OrderService {",
                         "L9 public List<String> listOrders(int limit) {"]),
    (C_CODE, "c", ["imports: stdio.h, util.h", "L3 #define MAX_ITEMS 64", "L5 struct item {",
                   "L9 static int count_items(struct item *items, int n)", "L14 int main(void)"]),
    (SHELL_CODE, "shell", ["imports: ./lib.sh", "L5 build() {", "L9 function deploy {"]),
])
def test_code_definitions(code: str, lang: str, needles: list[str]) -> None:
    out = explore(code, 600)
    assert f"kind: code:{lang}" in out
    for needle in needles:
        assert needle in out, needle


def test_log_description() -> None:
    out = explore(LOG_TEXT, 600)
    assert "kind: log" in out
    assert "time range: 2024-05-01 12:00:00 .. 2024-05-01 12:16:40" in out
    assert "levels: ERROR 11, WARN 20, INFO 970" in out
    assert "distinct error lines: 2" in out
    assert "L8 (x10) 2024-05-01 12:00:07 ERROR [db] connection refused on port 5432" in out
    assert "L1001 2024-05-01 12:16:40 ERROR [auth] token signature invalid for user 42" in out
    assert "head:" in out and "processed batch 0" in out
    assert "tail:" in out and "processed batch 999" in out


def test_text_description() -> None:
    out = explore(PROSE, 400)
    assert "kind: text" in out
    assert "L1 # Migration notes" in out
    assert "## Open problems" in out
    assert "/srv/import/schema.sql" in out
    assert "Final words: see you next week." in out


def test_tight_budget_keeps_header_and_essentials() -> None:
    out = explore(USERS_JSON, 40)
    assert est(out) <= 40
    assert out.startswith("[explore] kind: json;")
    assert "users" in out  # shallow keys survive before deep detail


@pytest.mark.parametrize("max_tokens", [0, -5])
def test_non_positive_budget(max_tokens: int) -> None:
    assert explore(USERS_JSON, max_tokens) == ""


@pytest.mark.parametrize("text", [
    "", " ", "\n\n\n", "\x00", "\x00" * 10_000, "\ud800", "\ud800\udfff" * 100, "{", "[", "{]", '{"a": ',
    "[1, 2", "null", '"str"', "\ufeff{\"a\": 1}", "\x00\x01\x02binary\xff\xfe" * 500, "a,b\n1,2\n3,4",
    "key:", ":::", "---\n---\n", "\t" * 1000, "def (\n" * 100, "{" * 100_000, '"' * 100_000,
    "[2024-05-01 00:00:00]" * 1000, "ERROR " * 10_000, "é" * 5000 + "\n" + "ß,ü\n" * 100,
])
def test_hostile_inputs_never_raise(text: str) -> None:
    for max_tokens in (1, 5, 50, 600):
        for hint in (None, "x.json", "x.csv", "x.py", "x.yaml", "\ud800.log"):
            out = explore(text, max_tokens, hint=hint)
            assert est(out) <= max_tokens
            out.encode("utf-8")
            assert "\x00" not in out
        assert detect_kind(text) in {"json", "yaml", "csv", "tsv", "log", "text"} or \
            detect_kind(text).startswith("code:")


def test_garbage_arguments_never_raise() -> None:
    assert isinstance(explore(None, 100), str)  # type: ignore[arg-type]
    assert isinstance(explore(12345, 100), str)  # type: ignore[arg-type]
    assert isinstance(explore("abc", "many"), str)  # type: ignore[arg-type]
    assert isinstance(explore("abc", 100, hint=42), str)  # type: ignore[arg-type]
    assert detect_kind(None) == "text"  # type: ignore[arg-type]


_any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=()),
                    max_size=3000)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=12), kids, max_size=6),
    max_leaves=60,
)
_structured = st.sampled_from([USERS_JSON[:5000], K8S_YAML, CSV_TEXT[:3000], PY_CODE, JS_CODE, GO_CODE,
                               LOG_TEXT[:4000], PROSE[:3000]])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_any_text, _structured, _json_value.map(json.dumps),
                 st.tuples(_structured, _any_text).map("".join)),
       st.integers(-3, 700), st.one_of(st.none(), st.sampled_from(["a.json", "b.py", "c.csv", "terminal"])))
def test_property_size_bound(text: str, max_tokens: int, hint: str | None) -> None:
    out = explore(text, max_tokens, hint=hint)
    if max_tokens <= 0:
        assert out == ""
        return
    assert est(out) <= max_tokens
    assert out == explore(text, max_tokens, hint=hint)
    if max_tokens >= 40:
        assert out.startswith("[explore] kind: ")


@settings(max_examples=150, deadline=None)
@given(_json_value)
def test_property_json_documents(value: object) -> None:
    text = json.dumps(value, indent=1)
    out = explore(text, 400)
    assert est(out) <= 400
    if isinstance(value, (dict, list)) and len(text) > 2:
        assert "kind: json" in out


def _five_mb() -> dict[str, str]:
    n = 5_000_000
    code = PY_CODE * (n // len(PY_CODE) + 1)
    return {
        "json": json.dumps([{"id": i, "name": f"user{i}", "tags": ["a", "b"], "n": {"x": i}} for i in range(85_000)]),
        "json-invalid": ('{"items": [' + ",".join(json.dumps({"id": i, "v": "x" * 20}) for i in range(140_000)))[:n],
        "json-lines": "\n".join(json.dumps({"ts": i, "event": "click"}) for i in range(170_000)),
        "yaml": "".join(f"key{i}:\n  name: n{i}\n  items:\n    - a\n    - b\n" for i in range(110_000))[:n],
        "csv": "id,name,price\n" + "".join(f"{i},item{i},{i * 1.5:.2f}\n" for i in range(260_000)),
        "python": code[:n],
        "log": (LOG_TEXT * (n // len(LOG_TEXT) + 1))[:n],
        "text": (PROSE * (n // len(PROSE) + 1))[:n],
        "one-line": "x" * n,
        "nul": "\x00" * n,
        "surrogates": "\ud800" * n,
        "newlines": "\n" * n,
        "braces": "{" * n,
        "error-words": "ERROR " * (n // 6),
    }


def test_five_megabyte_inputs_complete() -> None:
    # CPU time of this process: robust on a loaded machine.
    for name, text in _five_mb().items():
        t0 = time.process_time()
        out = explore(text, 600)
        elapsed = time.process_time() - t0
        assert est(out) <= 600, name
        assert "kind: " in out, name
        assert elapsed < 15.0, (name, elapsed)  # generous: completes, no tight timing


def test_deterministic_across_processes() -> None:
    script = (
        "import json\n"
        "from tests.test_explore import USERS_JSON, K8S_YAML, CSV_TEXT, PY_CODE, LOG_TEXT, PROSE\n"
        "from lossless_context.text.explore import explore\n"
        "print(json.dumps([explore(t, 300) for t in (USERS_JSON, K8S_YAML, CSV_TEXT, PY_CODE, LOG_TEXT, PROSE)]))\n"
    )
    root = Path(__file__).resolve().parents[1]
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(root))
        res = subprocess.run([sys.executable, "-c", script], cwd=root, env=env,
                             capture_output=True, text=True, check=True)
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1]
