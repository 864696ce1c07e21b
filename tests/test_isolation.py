"""Isolation: one user's history is invisible to another's tools; all SQL is parameterised.

Two users' sessions share one store (different session ids, no shared conversation_id, no
parent link). From each side, every tool probe of the other side answers exactly like a
probe of an id that does not exist (same error text once the number is replaced), grep
finds nothing of the other's unique canary, and lcm_expand_query never includes the
other's content. ``session_scope: "all"`` is refused unless ``cross_session_search: true``
is configured, and then finds it. Lineage works the other way round: a rotated child
session sees its parent's history, and sessions sharing a gateway ``conversation_id`` see
each other.

The last tests read the package source: every SQL statement that is built dynamically
must interpolate only placeholder lists and fixed identifiers (see ``SqlSafety``).
"""

from __future__ import annotations

import ast
import copy
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session

ALICE_CANARY = "quokka-7731-alice-ZEBRAFISH"
BOB_CANARY = "pangolin-4419-bob-MARMALADE"
PKG = Path(__file__).resolve().parents[1] / "lossless_context"


def _engine(path: Path, session: str, **cfg: Any) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": str(path), "summarizer": "extractive",
                                         "fresh_tail_tokens": 800, **cfg}, read_file=False))
    e.update_model(model="m", context_length=64_000)
    e.bind_session_state(None, session)
    return e


def _history(seed: int, canary: str, who: str) -> list[dict]:
    msgs = copy.deepcopy(coding_session(160, seed=seed).messages)
    msgs[3] = {"role": "user", "content": f"{who} here. My deploy token name is {canary}; remember it."}
    msgs[-2] = {"role": "user", "content": f"{who} again: the canary {canary} is also in the tail."}
    return msgs


def _load(e: LCMEngine, session: str, msgs: list[dict], **start: Any) -> None:
    e.on_session_start(session, platform="telegram", **start)
    out = e.compress(copy.deepcopy(msgs), force=True)
    assert out != msgs
    e.on_session_end(session, copy.deepcopy(msgs))
    e.on_session_start(session, boundary_reason="compression", old_session_id=session, **start)


def _call(e: LCMEngine, name: str, args: dict) -> dict:
    res = e.handle_tool_call(name, args)
    data = json.loads(res)
    assert isinstance(data, dict)
    return data


def _shape(err: str) -> str:
    return re.sub(r"\d+", "N", err)


@pytest.fixture()
def two_users(tmp_path):
    db = tmp_path / "lcm.db"
    alice, bob = _engine(db, "alice"), _engine(db, "bob")
    _load(alice, "alice", _history(1, ALICE_CANARY, "Alice"))
    _load(bob, "bob", _history(2, BOB_CANARY, "Bob"))
    con = alice.store.conn()
    ids = {}
    for who in ("alice", "bob"):
        ids[who] = {
            "m": [r[0] for r in con.execute("SELECT id FROM messages WHERE session_id=? ORDER BY id", (who,))],
            "s": [r[0] for r in con.execute("SELECT id FROM summaries WHERE session_id=? AND state='published'", (who,))],
        }
        assert ids[who]["m"] and ids[who]["s"]
    yield alice, bob, ids, db
    alice.store.close()
    bob.store.close()


def test_other_users_ids_answer_like_unknown_ids(two_users):
    alice, bob, ids, _ = two_users
    unknown_m = max(ids["alice"]["m"] + ids["bob"]["m"]) + 1000
    unknown_s = max(ids["alice"]["s"] + ids["bob"]["s"]) + 1000
    probes = 0
    for me, other in ((alice, "bob"), (bob, "alice")):
        for kind, unknown in (("m", unknown_m), ("s", unknown_s)):
            their = ids[other][kind]
            sample = their[:: max(1, len(their) // 25)]
            for tool, mk in (("lcm_describe", lambda i: {"id": i}),
                             ("lcm_expand", lambda i: {"id": i, "max_tokens": 500}),
                             ("lcm_expand_query", lambda i: {"prompt": "what is in it?", "summary_ids": [i]})):
                ref = _call(me, tool, mk(f"{kind}{unknown}"))
                assert set(ref) == {"error"}
                for i in sample:
                    got = _call(me, tool, mk(f"{kind}{i}"))
                    assert set(got) == {"error"}, f"{tool}({kind}{i}) of the other user answered: {str(got)[:200]}"
                    assert _shape(got["error"]) == _shape(ref["error"])
                    probes += 1
            if kind == "s":
                ref = _call(me, "lcm_grep", {"query": "pytest", "summary_id": f"s{unknown}"})
                for i in their:
                    got = _call(me, "lcm_grep", {"query": "pytest", "summary_id": f"s{i}"})
                    assert set(got) == {"error"} and _shape(got["error"]) == _shape(ref["error"])
                    probes += 1
    assert probes > 100
    from tests.test_hostile_input import record_counts

    record_counts("isolation", {"cross_user_id_probes": probes})


def test_grep_and_expand_query_never_show_the_other_user(two_users):
    alice, bob, ids, _ = two_users
    for me, mine, theirs in ((alice, ALICE_CANARY, BOB_CANARY), (bob, BOB_CANARY, ALICE_CANARY)):
        own = _call(me, "lcm_grep", {"query": mine})
        assert own["hits"] >= 1, "own canary is found"
        for args in ({"query": theirs}, {"query": theirs, "mode": "regex"}, {"query": theirs.split("-")[0]},
                     {"query": theirs, "scope": "summaries"}, {"query": f'"{theirs}"'}):
            res = _call(me, "lcm_grep", args)
            assert res.get("hits", 0) == 0 and theirs not in json.dumps(res.get("groups")), (args, res)
        for args in ({"prompt": f"What is {theirs}?"}, {"prompt": "what deploy token name?", "query": theirs},
                     {"prompt": "deploy token", "max_tokens": 12000}):
            res = _call(me, "lcm_expand_query", args)
            text = json.dumps({k: v for k, v in res.items() if k != "prompt"})  # the question is echoed
            assert theirs not in text
            other_sid = "bob" if me is alice else "alice"
            other_ids = {f"m{i}" for i in ids[other_sid]["m"]}
            assert not (set(res.get("sources", [])) & other_ids)


def test_cross_session_search_only_when_configured(two_users):
    alice, _bob, _ids, db = two_users
    refused = _call(alice, "lcm_grep", {"query": BOB_CANARY, "session_scope": "all"})
    assert "error" in refused and "cross_session_search" in refused["error"]
    for tool, args in (("lcm_describe", {"id": "m1", "session_scope": "all"}),
                       ("lcm_expand_query", {"prompt": BOB_CANARY, "session_scope": "all"})):
        assert "error" in _call(alice, tool, args)
    wide = _engine(db, "alice", cross_session_search=True)
    try:
        found = _call(wide, "lcm_grep", {"query": BOB_CANARY, "session_scope": "all"})
        assert found["hits"] >= 1
        assert _call(wide, "lcm_grep", {"query": BOB_CANARY})["hits"] == 0, "default scope stays the lineage"
    finally:
        wide.store.close()


def test_rotated_child_sees_parent_and_not_the_other_user(two_users):
    alice, bob, ids, _ = two_users
    alice.on_session_start("alice-2", boundary_reason="compression", old_session_id="alice", platform="telegram")
    assert alice.store.get_session("alice-2")["parent_id"] == "alice"
    assert _call(alice, "lcm_grep", {"query": ALICE_CANARY})["hits"] >= 1
    m = ids["alice"]["m"][3]
    assert "error" not in _call(alice, "lcm_describe", {"id": f"m{m}"})
    assert _call(alice, "lcm_grep", {"query": BOB_CANARY})["hits"] == 0
    # and the other user does not see the child either
    alice.on_session_end("alice-2", [{"role": "user", "content": "child-only-canary-WOMBAT-55"}])
    assert _call(bob, "lcm_grep", {"query": "child-only-canary-WOMBAT-55"})["hits"] == 0


def test_sessions_sharing_a_conversation_id_see_each_other(tmp_path):
    db = tmp_path / "lcm.db"
    a, b, c = _engine(db, "tg-1"), _engine(db, "tg-2"), _engine(db, "tg-3")
    a.on_session_start("tg-1", conversation_id="chat-42", platform="telegram")
    a.on_session_end("tg-1", [{"role": "user", "content": "first session says FALCON-1234"}])
    b.on_session_start("tg-2", conversation_id="chat-42", platform="telegram")
    b.on_session_end("tg-2", [{"role": "user", "content": "second session says HERON-5678"}])
    c.on_session_start("tg-3", conversation_id="chat-43", platform="telegram")
    c.on_session_end("tg-3", [{"role": "user", "content": "other chat says EGRET-9012"}])
    assert _call(a, "lcm_grep", {"query": "HERON-5678"})["hits"] >= 1
    assert _call(b, "lcm_grep", {"query": "FALCON-1234"})["hits"] >= 1
    for e in (a, b):
        assert _call(e, "lcm_grep", {"query": "EGRET-9012"})["hits"] == 0
    assert _call(c, "lcm_grep", {"query": "FALCON-1234"})["hits"] == 0


def test_reset_engine_does_not_carry_a_conversation_id_into_the_next_session(tmp_path):
    """/new or /resume on one engine: the next session is not linked to the previous chat."""
    e = _engine(tmp_path / "lcm.db", "carol")
    e.on_session_start("carol", conversation_id="chat-carol", platform="telegram")
    e.on_session_end("carol", [{"role": "user", "content": "carol's secret OSPREY-2468"}])
    e.on_session_reset()
    e.bind_session_state(None, "dave")
    e.on_session_start("dave", platform="cli")
    e.on_session_end("dave", [{"role": "user", "content": "dave was here"}])
    assert (e.store.get_session("dave") or {}).get("conversation_id") is None
    assert _call(e, "lcm_grep", {"query": "OSPREY-2468"})["hits"] == 0


# --------------------------------------------------------------------------- SQL is parameterised


class SqlSafety:
    """A small static check that dynamic SQL interpolates only trusted text.

    Checked expressions:
      (A) the SQL argument of every ``.execute/.executemany/.executescript`` call;
      (B) every dynamically built string (f-string with an interpolation, ``%``-format,
          ``.format()``, ``+``) whose literal text contains SQL (SELECT, INSERT INTO, WHERE, ...),
          wherever it is (assigned, passed to a wrapper such as ``rows()``/``ex()``).

    An expression is *safe* when every piece of text it can contain comes from:
      * string/number literals, or containers of them (tuples of migrations, column lists);
      * placeholder lists: a literal repeated (``'?' * n``, ``["%s"] * n``) and joined;
      * fixed identifiers: names whose every assignment (in the function, an enclosing
        function, the module, or the module it is imported from) is safe — e.g. ``table =
        "messages" if is_msg else "summaries"``, ``for table in ("messages", "summaries")``,
        a ``where`` list whose every ``append`` is safe, the ``MSG_COLS`` constant;
      * string methods of safe text (join, format, replace, strip, split, splitlines, ...),
        ``chr(<literal>)``, numbers (``int()``/``len()``), hex digits (``.hex()``), and calls of the package's own
        functions whose returns are safe for the (safe) arguments given;
      * a parameter of a named function when every call site in the package passes a safe
        argument; the parameter of a lambda callback (``lambda sql, p=(): c.execute(sql,
        p)``) is accepted because its callers' dynamic SQL is covered by (B).
    Anything else (a parameter with an unsafe caller, an attribute, a value from input) is
    an offender.
    """

    SQL_RE = re.compile(r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|PRAGMA|CREATE\s+"
                        r"(TABLE|INDEX|TRIGGER|VIRTUAL)|DROP\s+(TABLE|INDEX)|ALTER\s+TABLE|WHERE|ORDER\s+BY)\b")
    STR_METHODS = {"join", "format", "replace", "strip", "lstrip", "rstrip", "lower", "upper", "split",
                   "splitlines", "rsplit", "title", "casefold", "removeprefix", "removesuffix"}
    PASS_BUILTINS = {"str", "sorted", "list", "tuple", "reversed", "set", "frozenset", "dict"}
    NUMBER_BUILTINS = {"int", "float", "len", "max", "min", "abs", "round", "bool", "chr", "range", "enumerate"}
    SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)

    def __init__(self, sources: dict[str, str]) -> None:
        """sources: dotted module name -> source text."""
        self.mods = {name: ast.parse(src) for name, src in sources.items()}
        self.parent: dict[ast.AST, ast.AST] = {}
        self.mod_of: dict[ast.AST, str] = {}
        self.funcs: dict[str, list[ast.AST]] = {}
        self.calls: dict[str, list[ast.Call]] = {}
        for mname, tree in self.mods.items():
            for node in ast.walk(tree):
                self.mod_of[node] = mname
                for child in ast.iter_child_nodes(node):
                    self.parent[child] = node
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.funcs.setdefault(node.name, []).append(node)
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name:
                        self.calls.setdefault(name, []).append(node)
        self._memo: dict[tuple, bool] = {}
        self._busy: set[tuple] = set()

    # -- scopes ----------------------------------------------------------------------

    def scope(self, node: ast.AST) -> ast.AST:
        p = self.parent.get(node)
        while p is not None and not isinstance(p, self.SCOPES):
            p = self.parent.get(p)
        return p

    def enclosing(self, scope: ast.AST):
        s = scope
        while s is not None:
            yield s
            if isinstance(s, ast.Module):
                return
            s = self.scope(s)

    def bindings(self, scope: ast.AST, name: str) -> list[tuple]:
        out: list[tuple] = []
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = scope.args
            params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            params += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
            if name in params:
                out.append(("param", scope, name))
        for node in ast.walk(scope):
            if node is not scope and isinstance(node, self.SCOPES):
                continue
            if self.scope(node) is not scope and node is not scope:
                continue
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    out.extend(self._target(t, node.value, name, elem=False))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                out.extend(self._target(node.target, node.value, name, elem=False))
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                out.extend(self._target(node.target, node.iter, name, elem=True))
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None and name in {n.id for n in ast.walk(item.optional_vars)
                                                                   if isinstance(n, ast.Name)}:
                        out.append(("unknown", item))
            elif isinstance(node, ast.NamedExpr) and node.target.id == name:
                out.append(("value", node.value))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for al in node.names:
                    if (al.asname or al.name.split(".")[0]) == name:
                        out.append(("import", node, al.name))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == name):
                if node.func.attr in ("append", "add") and node.args:
                    out.append(("value", node.args[0]))
                elif node.func.attr == "insert" and len(node.args) > 1:
                    out.append(("value", node.args[1]))
                elif node.func.attr in ("extend", "update") and node.args:
                    out.append(("value", node.args[0]))
        return out

    def _target(self, target: ast.AST, value: ast.AST, name: str, elem: bool) -> list[tuple]:
        if isinstance(value, ast.IfExp) and isinstance(target, (ast.Tuple, ast.List)):
            return self._target(target, value.body, name, elem) + self._target(target, value.orelse, name, elem)
        if isinstance(target, ast.Name):
            return [("elem" if elem else "value", value)] if target.id == name else []
        if isinstance(target, (ast.Tuple, ast.List)):
            out = []
            for i, t in enumerate(target.elts):
                if not elem and isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                    out.extend(self._target(t, value.elts[i], name, False))
                else:
                    out.extend(self._target(t, value, name, True))  # a component of the value
            return out
        return []

    # -- safety ------------------------------------------------------------------------

    def safe(self, node: ast.AST, env: tuple = ()) -> bool:
        key = (id(node), env)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return True  # a cycle adds nothing new: the other bindings decide
        self._busy.add(key)
        try:
            res = self._safe(node, env)
        finally:
            self._busy.discard(key)
        self._memo[key] = res
        return res

    def _safe(self, n: ast.AST, env: tuple) -> bool:
        s = self.safe
        if isinstance(n, ast.Constant):
            return True
        if isinstance(n, ast.JoinedStr):
            return all(s(v.value, env) for v in n.values if isinstance(v, ast.FormattedValue))
        if isinstance(n, ast.FormattedValue):
            return s(n.value, env)
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return all(s(e, env) for e in n.elts)
        if isinstance(n, ast.Dict):
            return all(s(v, env) for v in n.values) and all(k is None or s(k, env) for k in n.keys)
        if isinstance(n, ast.Starred):
            return s(n.value, env)
        if isinstance(n, ast.IfExp):
            return s(n.body, env) and s(n.orelse, env)
        if isinstance(n, ast.BoolOp):
            return all(s(v, env) for v in n.values)
        if isinstance(n, (ast.Compare, ast.UnaryOp)):
            return True  # booleans / numbers
        if isinstance(n, ast.BinOp):
            if isinstance(n.op, ast.Mult):  # a literal repeated: '?' * n, ["%s"] * n
                lit = [x for x in (n.left, n.right) if isinstance(x, (ast.Constant, ast.List, ast.Tuple))]
                if lit:
                    return all(s(x, env) for x in lit)
            if isinstance(n.op, (ast.Add, ast.Mod, ast.Mult)):
                return s(n.left, env) and s(n.right, env)
            return True  # arithmetic
        if isinstance(n, ast.Subscript):
            return s(n.value, env)
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return s(n.elt, self._bind_comp(n, env))
        if isinstance(n, ast.Name):
            return self._name(n, env)
        if isinstance(n, ast.Call):
            return self._call(n, env)
        return False  # attributes and everything else: not provably trusted

    def _bind_comp(self, n: ast.AST, env: tuple) -> tuple:
        extra = []
        for g in n.generators:
            ok = self.safe(g.iter, env)
            for t in ast.walk(g.target):
                if isinstance(t, ast.Name):
                    extra.append((id(self.scope(n)), t.id, ok))
        return tuple(sorted(set(env) | set(extra)))

    def _name(self, n: ast.Name, env: tuple) -> bool:
        for sc in self.enclosing(self.scope(n)):
            for sid, name, ok in env:
                if sid == id(sc) and name == n.id:
                    return ok
            b = self.bindings(sc, n.id)
            if b:
                return all(self._binding(x, env) for x in b)
        return n.id in ("True", "False", "None")

    def _binding(self, b: tuple, env: tuple) -> bool:
        kind = b[0]
        if kind in ("value", "elem"):
            return self.safe(b[1], env)
        if kind == "param":
            _, fn, pname = b
            for sid, name, ok in env:
                if sid == id(fn) and name == pname:
                    return ok
            if isinstance(fn, ast.Lambda):
                return True  # callback wrappers: their callers' dynamic SQL is rule (B)'s
            return self._param_from_callers(fn, pname)
        if kind == "import":
            node, name = b[1], b[2]
            if isinstance(node, ast.ImportFrom):
                mod = self._resolve(self.mod_of[node], node.module, node.level)
                if mod in self.mods:
                    tree = self.mods[mod]
                    bs = self.bindings(tree, name)
                    return bool(bs) and all(self._binding(x, ()) for x in bs)
            return False
        return False

    def _resolve(self, here: str, module: str | None, level: int) -> str:
        if level == 0:
            name = module or ""
        else:
            parts = here.split(".")[:-level]  # a module's package is its name minus the last part
            name = ".".join(parts + ([module] if module else []))  # (a package's own is "pkg.__init__")
        # a package is read from its __init__.py, kept under "pkg.__init__"
        return name if name in self.mods or name + ".__init__" not in self.mods else name + ".__init__"

    def _param_from_callers(self, fn: ast.AST, pname: str) -> bool:
        a = fn.args
        pos = [x.arg for x in a.posonlyargs + a.args]
        sites = self.calls.get(fn.name, [])
        if not sites:
            return False
        for call in sites:
            shift = 1 if pos and pos[0] in ("self", "cls") and isinstance(call.func, ast.Attribute) else 0
            cands = [k.value for k in call.keywords if k.arg == pname]
            if not cands and pname in pos:
                i = pos.index(pname) - shift
                starred = [x.value for x in call.args[:i + 1] if isinstance(x, ast.Starred)]
                if starred:
                    cands = starred  # *args: any of its items may land here
                elif 0 <= i < len(call.args):
                    cands = [call.args[i]]
            if not cands:
                cands = [k.value for k in call.keywords if k.arg is None]  # **kwargs, else the default
            if not all(self.safe(x, ()) for x in cands):
                return False
        return True

    def _call(self, n: ast.Call, env: tuple) -> bool:
        s = self.safe
        args = list(n.args) + [k.value for k in n.keywords]
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in self.STR_METHODS:
            return s(f.value, env) and all(s(x, env) for x in args)
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if isinstance(f, ast.Name) and name in self.NUMBER_BUILTINS:
            return name != "chr" or all(isinstance(x, ast.Constant) for x in args)
        if isinstance(f, ast.Name) and name in self.PASS_BUILTINS:
            return all(s(x, env) for x in args)
        if isinstance(f, ast.Attribute) and f.attr == "fromkeys":
            return all(s(x, env) for x in args)
        if isinstance(f, ast.Attribute) and f.attr == "hex" and not args:
            return True  # bytes.hex() / int.hex(): hex digits only, whatever the value
        # the package's own helpers: safe when their returns are safe for these arguments
        defs = self.funcs.get(name or "", [])
        if not defs:
            return False
        for fn in defs:
            a = fn.args
            pos = [x.arg for x in a.posonlyargs + a.args]
            shift = 1 if pos and pos[0] in ("self", "cls") and isinstance(f, ast.Attribute) else 0
            bound = []
            for i, p in enumerate(pos[shift:]):
                arg = n.args[i] if i < len(n.args) and not isinstance(n.args[i], ast.Starred) else next(
                    (k.value for k in n.keywords if k.arg == p), None)
                bound.append((id(fn), p, True if arg is None else s(arg, env)))
            fenv = tuple(sorted(set(bound)))
            rets = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None
                    and self.scope(r) is fn]
            if not rets or not all(s(r, fenv) for r in rets):
                return False
        return True

    # -- the two rules -----------------------------------------------------------------------

    def _dynamic_sql(self, n: ast.AST) -> bool:
        if isinstance(n, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in n.values):
            lits = "".join(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
        elif isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mod, ast.Add)):
            lits = " ".join(c.value for c in ast.walk(n) if isinstance(c, ast.Constant) and isinstance(c.value, str))
            if isinstance(self.parent.get(n), ast.BinOp):
                return False  # judged at the outermost operator
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format"
              and isinstance(n.func.value, ast.Constant) and isinstance(n.func.value.value, str)):
            lits = n.func.value.value
        else:
            return False
        return bool(self.SQL_RE.search(lits))

    def offenders(self) -> list[str]:
        out = []
        for mname, tree in self.mods.items():
            for node in ast.walk(tree):
                target = None
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("execute", "executemany", "executescript") and node.args):
                    target = node.args[0]
                elif self._dynamic_sql(node):
                    target = node
                if target is not None and not self.safe(target):
                    out.append(f"{mname}:{target.lineno}: {ast.unparse(target)[:160]}")
        return sorted(set(out))


def _package_sources() -> dict[str, str]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        out[".".join(rel.parts)] = p.read_text(encoding="utf-8")
    return out


def test_all_sql_in_the_package_is_parameterised():
    offenders = SqlSafety(_package_sources()).offenders()
    assert not offenders, "SQL built from untrusted text:\n" + "\n".join(offenders)


def test_sql_checker_flags_interpolated_values_and_accepts_placeholders():
    src = textwrap.dedent('''
        COLS = "id, text"
        TABLES = ("messages", "summaries")

        def ok(c, ids, is_msg, session_id=None):
            table = "messages" if is_msg else "summaries"
            where = []
            if session_id is not None:
                where.append(f"session_id IN ({','.join('?' * len(ids))})")
            w, p = ("", ()) if session_id is None else (" WHERE x=?", (session_id,))
            c.execute(f"SELECT {COLS} FROM {table}{w}" + "".join(f" AND {x}" for x in where), p)
            for t in TABLES:
                c.execute(f"DELETE FROM {t} WHERE id IN ({placeholders(ids)})", ids)
            run(c, "SELECT 1")

        def placeholders(ids):
            return ",".join(["?"] * len(ids))

        def run(c, sql):
            return c.execute(sql)

        def bad_value(c, name):
            c.execute(f"SELECT * FROM messages WHERE role = '{name}'")

        def bad_format(c, user):
            c.execute("SELECT * FROM messages WHERE id = %s" % user.id)

        def bad_dotformat(c, q):
            sql = "SELECT * FROM t WHERE text LIKE '{}'".format(q)
            c.execute(sql)

        def bad_wrapper(c, msg):
            run(c, msg["content"])

        def bad_built_elsewhere(db, term):
            db.rows(f"SELECT id FROM messages WHERE text = '{term}'")
        ''')
    found = SqlSafety({"pkg.mod": src}).offenders()
    run_line = src.splitlines().index("    return c.execute(sql)") + 1
    text = "\n".join(found)
    assert "role = '{name}'" in text and "% user.id" in text and ".format(q)" in text
    assert "WHERE text = '{term}'" in text
    assert any(x.endswith(": sql") and int(x.split(":")[1]) == run_line for x in found), \
        "run() is flagged: one of its callers passes message content"
    for safe_text in ("{COLS}", "{t}", "placeholders(ids)", "SELECT 1", "{table}"):
        assert safe_text not in text, f"false positive: {safe_text} in {found}"
    assert len(found) == 6, found
