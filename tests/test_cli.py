"""The `lcm` command line, run as a real subprocess on real files.

A module-wide store is built by a short `lcm demo --messages 600`; every read command is
checked against it with real content (a canary found by grep, the verbatim message from
expand, status numbers equal to the store's own). Error paths must exit non-zero with one
line and no traceback. install/uninstall edit a config.yaml with comments and other keys.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from lossless_context.demo import with_timestamps
from lossless_context.demo.sessions import coding_session

ROOT = Path(__file__).resolve().parents[1]
DEMO_MESSAGES = 600


def lcm_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LCM_", "HERMES_"))}
    env["HERMES_HOME"] = str(home)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"
    return env


def run_lcm(*args: str, home: Path, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lossless_context.cli.commands", *args], capture_output=True, text=True,
                          env=lcm_env(home), cwd=str(cwd or home), timeout=timeout)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return r


def one_line_failure(r: subprocess.CompletedProcess, code: int | None = None) -> str:
    assert r.returncode != 0, r.stdout
    if code is not None:
        assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("lcm: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-demo")
    home = d / "hermes"
    home.mkdir()
    store = d / "store" / "lcm.db"
    html = d / "demo.html"
    r = ok(run_lcm("demo", "--messages", str(DEMO_MESSAGES), "--store", str(store), "--html", str(html), "--json",
                   home=home))
    data = json.loads(r.stdout)
    session = coding_session(DEMO_MESSAGES, 0)
    return SimpleNamespace(store=store, home=home, dir=d, data=data, html=html, session=session,
                           fed=with_timestamps(session.messages))  # what the demo's host fed the engine


def lcm_at(demo, *args: str) -> subprocess.CompletedProcess:
    return run_lcm("--store", str(demo.store), *args, home=demo.home)


# -- demo ----------------------------------------------------------------------------------------


def test_demo_json_results(demo):
    d = demo.data
    assert d["messages_generated"] == DEMO_MESSAGES
    assert d["messages_stored"] == DEMO_MESSAGES, "every message stored exactly once"
    assert d["compactions"] >= 1
    assert int(d["nodes_by_depth"]["0"]) >= 1
    assert d["tokens_after"] < d["context_length"] < d["tokens_before"]
    assert d["canaries"], "the session plants canaries"
    assert d["canaries_recovered"] == len(d["canaries"]), [c for c in d["canaries"] if not c["found"]]
    for c in d["canaries"]:
        assert c["found"] and c["expanded_verbatim"] and re.fullmatch(r"m\d+", c["hit_id"])
    assert Path(d["html"]) == demo.html and demo.html.is_file()
    assert '<script type="application/json" id="lcm-data">' in demo.html.read_text()


def test_demo_human_tables(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    r = ok(run_lcm("demo", "--messages", "300", "--seed", "3", "--store", str(tmp_path / "s.db"), home=home))
    out = r.stdout
    for label in ("messages stored", "tokens before (whole session)", "tokens after (final context)", "compactions",
                  "summary nodes by depth", "summariser", "canaries recovered", "HTML view"):
        assert label in out, out
    m = re.search(r"canaries recovered\s*│?\s*(\d+)/(\d+)", out)
    assert m and m.group(1) == m.group(2), out
    assert (tmp_path / "lcm-demo.html").is_file(), "default view next to the store"
    assert "Traceback" not in r.stderr


def test_demo_rotation_lineage(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    store = tmp_path / "rot.db"
    d = json.loads(ok(run_lcm("demo", "--messages", "400", "--rotate", "--store", str(store), "--json",
                              home=home)).stdout)
    assert len(d["sessions"]) == d["compactions"] + 1 >= 2
    assert d["canaries_recovered"] == len(d["canaries"])
    rows = json.loads(ok(run_lcm("--store", str(store), "sessions", "--json", home=home)).stdout)
    parents = {r["id"]: r["parent_id"] for r in rows}
    for prev, cur in zip(d["sessions"], d["sessions"][1:]):
        assert parents[cur] == prev
    table = ok(run_lcm("--store", str(store), "sessions", home=home)).stdout
    assert "└─ " + d["sessions"][1] in table


# -- status / sessions ---------------------------------------------------------------------------------


def test_status_matches_store(demo):
    st = json.loads(ok(lcm_at(demo, "status", "--json")).stdout)
    c = sqlite3.connect(demo.store)
    try:
        n_msgs = c.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        by_depth = dict(c.execute("SELECT depth, COUNT(*) FROM summaries WHERE state='published' GROUP BY depth"))
        n_sessions = c.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    finally:
        c.close()
    assert st["messages"] == n_msgs == DEMO_MESSAGES
    assert st["sessions"] == n_sessions == 1
    assert st["summaries_by_depth"] == {str(k): v for k, v in by_depth.items()}
    assert st["summaries_by_depth"] == demo.data["nodes_by_depth"]
    assert st["compactions"] == demo.data["compactions"]
    assert st["last_compaction_session"] == "demo-0"
    human = ok(lcm_at(demo, "status")).stdout
    assert str(demo.store) in human and f"{DEMO_MESSAGES:,}" in human and "last compaction" in human
    for d, n in by_depth.items():
        assert f"d{d}: {n}" in human


def test_sessions_table(demo):
    rows = json.loads(ok(lcm_at(demo, "sessions", "--json")).stdout)
    assert [r["id"] for r in rows] == ["demo-0"]
    assert rows[0]["messages"] == DEMO_MESSAGES
    assert rows[0]["summaries"] == sum(demo.data["nodes_by_depth"].values())
    out = ok(lcm_at(demo, "sessions")).stdout
    assert "demo-0" in out and f"{DEMO_MESSAGES}" in out


# -- grep / describe / expand ------------------------------------------------------------------------------


def test_grep_finds_every_canary(demo):
    for c in demo.data["canaries"]:
        data = json.loads(ok(lcm_at(demo, "grep", c["value"], "--json")).stdout)
        hits = [h for g in data["groups"] for h in g["hits"]]
        assert c["hit_id"] in [h["id"] for h in hits], (c, hits)
        human = ok(lcm_at(demo, "grep", c["value"])).stdout
        assert c["hit_id"] in human


def test_grep_options_and_regex(demo):
    c = next(c for c in demo.data["canaries"] if c["kind"] == "number_in_tool_output")
    data = json.loads(ok(lcm_at(demo, "grep", c["value"][:3] + r"\d{2}", "--mode", "regex", "--scope", "messages",
                                "--limit", "100", "--json")).stdout)
    assert c["hit_id"] in [h["id"] for g in data["groups"] for h in g["hits"]]
    data = json.loads(ok(lcm_at(demo, "grep", "the", "--limit", "2", "--json")).stdout)
    assert data["hits"] == 2 and data["next_cursor"]
    page2 = json.loads(ok(lcm_at(demo, "grep", "the", "--limit", "2", "--cursor", data["next_cursor"],
                                 "--json")).stdout)
    first = {h["id"] for g in data["groups"] for h in g["hits"]}
    assert first.isdisjoint(h["id"] for g in page2["groups"] for h in g["hits"])
    ok(lcm_at(demo, "grep", c["value"], "--session", "demo-0", "--all-sessions"))


def _summarised_canary(demo):
    for c in demo.data["canaries"]:
        if c["summary_chain"]:
            return c
    pytest.skip("no canary was compacted away in this run")


def test_describe_summary_and_message(demo):
    c = _summarised_canary(demo)
    top = c["summary_chain"][-1]
    d = json.loads(ok(lcm_at(demo, "describe", top, "--json")).stdout)
    assert d["id"] == top and d["depth"] == len(c["summary_chain"]) - 1
    assert d["parents"] == []
    human = ok(lcm_at(demo, "describe", top)).stdout
    assert f"depth {d['depth']}" in human and "parents: none" in human
    leaf = c["summary_chain"][0]
    dl = json.loads(ok(lcm_at(demo, "describe", leaf, "--json")).stdout)
    assert dl["kind"] == "leaf" and dl["depth"] == 0 and c["hit_id"] in dl["children"]
    dm = json.loads(ok(lcm_at(demo, "describe", c["hit_id"], "--json")).stdout)
    orig = demo.fed[next(x for x in demo.session.canaries if x.key == c["key"]).message_index]
    assert dm["role"] == orig["role"] and dm["covered_by"] == c["summary_chain"]
    assert "covered by: " + " → ".join(c["summary_chain"]) in ok(lcm_at(demo, "describe", c["hit_id"])).stdout


def test_expand_returns_verbatim_message(demo):
    for c in demo.data["canaries"]:
        orig = demo.fed[next(x for x in demo.session.canaries if x.key == c["key"]).message_index]
        d = json.loads(ok(lcm_at(demo, "expand", c["hit_id"], "--max-tokens", "12000", "--json")).stdout)
        assert d["message"] == orig
        human = ok(lcm_at(demo, "expand", c["hit_id"], "--max-tokens", "12000")).stdout
        if isinstance(orig.get("content"), str) and orig["content"]:
            assert orig["content"] in human
        assert c["value"] in human


def test_expand_summary_children_and_paging(demo):
    c = _summarised_canary(demo)
    leaf = c["summary_chain"][0]
    d = json.loads(ok(lcm_at(demo, "expand", leaf, "--max-tokens", "12000", "--json")).stdout)
    ids = [ch["id"] for ch in d["children"]]
    assert all(i.startswith("m") for i in ids)
    human = ok(lcm_at(demo, "expand", leaf, "--max-tokens", "200")).stdout
    assert f"── {leaf}" in human and "── m" in human
    small = json.loads(ok(lcm_at(demo, "expand", leaf, "--max-tokens", "200", "--json")).stdout)
    if small["next_cursor"]:
        assert f"--cursor {small['next_cursor']}" in human
        nxt = json.loads(ok(lcm_at(demo, "expand", leaf, "--max-tokens", "200", "--cursor", small["next_cursor"],
                                   "--json")).stdout)
        assert nxt["from"] == len(small["children"])


# -- view / doctor / backup -----------------------------------------------------------------------------------


def test_view_writes_self_contained_html(demo, tmp_path):
    out = tmp_path / "v.html"
    r = ok(lcm_at(demo, "view", "-o", str(out)))
    assert "demo-0" in r.stdout
    page = out.read_text()
    assert '<script type="application/json" id="lcm-data">' in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "no network resources"
    data = json.loads(re.search(r'id="lcm-data">(.*?)</script>', page, re.S).group(1))
    assert data["session"] == "demo-0" and len(data["messages"]) == DEMO_MESSAGES
    ok(lcm_at(demo, "view", "demo-0", "-o", str(tmp_path / "v2.html")))


def test_doctor_healthy_and_repair(demo, tmp_path):
    r = ok(lcm_at(demo, "doctor"))
    assert "healthy" in r.stdout
    assert json.loads(ok(lcm_at(demo, "doctor", "--json")).stdout)["ok"] is True
    copy = tmp_path / "copy.db"
    ok(lcm_at(demo, "backup", "-o", str(copy)))
    c = sqlite3.connect(copy)
    c.execute("DELETE FROM context_items")
    c.commit()
    c.close()
    bad = run_lcm("--store", str(copy), "doctor", home=demo.home)
    assert bad.returncode == 1 and "FAIL" in bad.stdout and "unreachable" in bad.stdout
    fixed = ok(run_lcm("--store", str(copy), "doctor", "--repair", home=demo.home))
    assert "repaired" in fixed.stdout
    ok(run_lcm("--store", str(copy), "doctor", home=demo.home))


def test_backup_is_a_complete_store(demo, tmp_path):
    out = tmp_path / "b.db"
    r = ok(lcm_at(demo, "backup", "-o", str(out)))
    assert "backed up" in r.stdout
    st = json.loads(ok(run_lcm("--store", str(out), "status", "--json", home=demo.home)).stdout)
    assert st["messages"] == DEMO_MESSAGES and st["summaries_by_depth"] == demo.data["nodes_by_depth"]
    assert (out.stat().st_mode & 0o777) == 0o600
    line = one_line_failure(lcm_at(demo, "backup", "-o", str(out)), 1)
    assert "exists" in line
    ok(lcm_at(demo, "backup", "-o", str(out), "--force"))
    pg = one_line_failure(run_lcm("--store", "postgresql://u@127.0.0.1:1/x", "backup", "-o", str(tmp_path / "p"),
                                  home=demo.home), 1)
    assert "pg_dump" in pg


# -- errors ------------------------------------------------------------------------------------------------------


def test_user_errors_are_one_line(demo, tmp_path):
    h = demo.home
    missing = tmp_path / "nope" / "lcm.db"
    for args in (["status"], ["sessions"], ["grep", "x"], ["describe", "s1"], ["doctor"], ["view", "-o",
                 str(tmp_path / "x.html")], ["export"], ["backup", "-o", str(tmp_path / "b.db")]):
        line = one_line_failure(run_lcm("--store", str(missing), *args, home=h), 1)
        assert "no store at" in line
    assert not missing.exists() and not missing.parent.exists(), "a read command must not create a store"
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert "not an lcm store" in one_line_failure(run_lcm("--store", str(text), "status", home=h), 1)
    foreign = tmp_path / "foreign.db"
    c = sqlite3.connect(foreign)
    c.execute("CREATE TABLE t(x)")
    c.commit()
    c.close()
    assert "not an lcm store" in one_line_failure(run_lcm("--store", str(foreign), "status", home=h), 1)
    assert "unknown id s999999" in one_line_failure(lcm_at(demo, "describe", "s999999"), 1)
    assert "not an id" in one_line_failure(lcm_at(demo, "expand", "zz"), 1)
    assert "unknown session" in one_line_failure(lcm_at(demo, "grep", "x", "--session", "nope"), 1)
    assert "unknown session" in one_line_failure(lcm_at(demo, "export", "nope"), 1)
    assert "invalid regex" in one_line_failure(lcm_at(demo, "grep", "(", "--mode", "regex"), 1)
    assert "cannot read" in one_line_failure(lcm_at(demo, "import", "jsonl", str(tmp_path / "missing.jsonl")), 1)
    assert "not a lossless-context export" in one_line_failure(lcm_at(demo, "import", "jsonl", str(text)), 1)
    assert "--session" in one_line_failure(lcm_at(demo, "import", "hermes"), 1)
    assert "no Hermes session database" in one_line_failure(
        lcm_at(demo, "import", "hermes", "--all", "--hermes-home", str(tmp_path / "nohome")), 1)
    # usage errors: one line too, exit 2
    assert "Missing argument" in one_line_failure(lcm_at(demo, "grep"), 2)
    assert "No such command" in one_line_failure(lcm_at(demo, "frobnicate"), 2)
    assert "--messages" in one_line_failure(run_lcm("demo", "--messages", "5", home=h), 2)
    assert "--base-url" in one_line_failure(run_lcm("demo", "--summarizer", "openai", "--store",
                                                    str(tmp_path / "o.db"), home=h), 1)


def test_help_for_every_command(tmp_path):
    home = tmp_path
    top = ok(run_lcm("--help", home=home)).stdout
    cmds = ["demo", "install", "uninstall", "status", "sessions", "grep", "describe", "expand", "view", "export",
            "import", "doctor", "backup"]
    for c in cmds:
        assert c in top
        assert "Usage: lcm " + c in ok(run_lcm(c, "--help", home=home)).stdout
    for sub in ("jsonl", "hermes"):
        assert f"Usage: lcm import {sub}" in ok(run_lcm("import", sub, "--help", home=home)).stdout
    assert "lcm, version" in ok(run_lcm("--version", home=home)).stdout


def test_console_script_installed():
    exe = Path(sys.executable).parent / "lcm"
    if not exe.exists():
        pytest.skip("the lcm console script is not installed in this environment")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Lossless Context Management" in r.stdout


# -- install / uninstall -----------------------------------------------------------------------------------------

CONFIG = """\
# Hermes configuration — hand-edited, keep my comments!
model:
  default: my-model   # the usual one
  provider: custom
  context_length: 128000

context:
  engine: compressor  # built-in

plugins:
  enabled:
    - other-plugin    # keep me
  disabled:
    - lcm

display:
  skin: mono
"""


def test_install_uninstall_preserves_config(tmp_path):
    home = tmp_path / "hermes"
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text(CONFIG)
    r = ok(run_lcm("install", "--hermes-home", str(home), "--mode", "directory", home=home))
    assert "installed" in r.stdout
    text = cfg.read_text()
    for comment in ("# Hermes configuration — hand-edited, keep my comments!", "# the usual one", "# keep me"):
        assert comment in text
    data = yaml.safe_load(text)
    assert data["context"]["engine"] == "lcm"
    assert data["plugins"]["enabled"] == ["other-plugin", "lcm"]
    assert "lcm" not in (data["plugins"].get("disabled") or [])
    assert data["model"] == {"default": "my-model", "provider": "custom", "context_length": 128000}
    assert data["display"] == {"skin": "mono"}
    plugin = home / "plugins" / "lcm"
    pkg = ROOT / "lossless_context" / "hermes" / "plugin_files"
    for name in ("plugin.yaml", "__init__.py"):
        assert (plugin / name).read_bytes() == (pkg / name).read_bytes()
    # idempotent
    before = cfg.read_bytes()
    again = ok(run_lcm("install", "--hermes-home", str(home), "--mode", "directory", home=home))
    assert "nothing to do" in again.stdout and cfg.read_bytes() == before
    # the host's own loader sees the engine and the plugin
    from hermes_cli.config import load_config  # type: ignore

    old = os.environ.get("HERMES_HOME")
    os.environ["HERMES_HOME"] = str(home)
    try:
        loaded = load_config()
    finally:
        if old is None:
            os.environ.pop("HERMES_HOME", None)
        else:
            os.environ["HERMES_HOME"] = old
    assert loaded["context"]["engine"] == "lcm" and "lcm" in loaded["plugins"]["enabled"]

    r = ok(run_lcm("uninstall", "--hermes-home", str(home), home=home))
    assert "uninstalled" in r.stdout
    text = cfg.read_text()
    assert "# keep me" in text and "# the usual one" in text
    data = yaml.safe_load(text)
    assert data["context"]["engine"] == "compressor"
    assert data["plugins"]["enabled"] == ["other-plugin"]
    assert data["display"] == {"skin": "mono"}
    assert not plugin.exists()
    before = cfg.read_bytes()
    assert "nothing to do" in ok(run_lcm("uninstall", "--hermes-home", str(home), home=home)).stdout
    assert cfg.read_bytes() == before


def test_install_creates_missing_config_and_entrypoint_mode(tmp_path):
    home = tmp_path / "fresh"
    ok(run_lcm("install", "--hermes-home", str(home), home=tmp_path))
    data = yaml.safe_load((home / "config.yaml").read_text())
    assert data == {"context": {"engine": "lcm"}, "plugins": {"enabled": ["lcm"]}}
    assert not (home / "plugins" / "lcm").exists(), "entrypoint mode writes no folder"
    ok(run_lcm("install", "--hermes-home", str(home), "--mode", "directory", home=tmp_path))
    assert (home / "plugins" / "lcm" / "plugin.yaml").is_file()
    r = ok(run_lcm("install", "--hermes-home", str(home), home=tmp_path))
    assert not (home / "plugins" / "lcm").exists(), "switching to entrypoint mode removes our folder"
    assert "removed" in r.stdout
    # HERMES_HOME is the default home
    other = tmp_path / "envhome"
    ok(run_lcm("install", home=other, cwd=tmp_path))
    assert yaml.safe_load((other / "config.yaml").read_text())["context"]["engine"] == "lcm"


def test_install_refuses_broken_config(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text("model: [unclosed\n")
    line = one_line_failure(run_lcm("install", "--hermes-home", str(home), home=home), 1)
    assert "not valid YAML" in line
    (home / "config.yaml").write_text("context: just-a-string\n")
    assert "must be a mapping" in one_line_failure(run_lcm("install", "--hermes-home", str(home), home=home), 1)
    assert (home / "config.yaml").read_text() == "context: just-a-string\n"


def test_demo_with_openai_compatible_summariser(tmp_path):
    from tests.support.fake_openai import FakeOpenAI, SummariserResponder

    home = tmp_path / "h"
    home.mkdir()
    with FakeOpenAI(responder=SummariserResponder()) as srv:
        env_key = "FAKE_SUMMARY_API_KEY"
        os.environ[env_key] = "sk-test"
        try:
            r = run_lcm("demo", "--messages", "300", "--store", str(tmp_path / "o.db"), "--summarizer", "openai",
                        "--base-url", srv.base_url, "--model", "fake-summariser", "--api-key-env", env_key, "--json",
                        home=home)
        finally:
            os.environ.pop(env_key, None)
        calls = srv.chat_requests
    d = json.loads(ok(r).stdout)
    assert d["summarizer"] == "openai" and d["summarizer_calls"] >= 1 and calls
    assert d["canaries_recovered"] == len(d["canaries"])
    assert all(c.json["model"] == "fake-summariser" for c in calls)


def test_grep_time_filters(demo):
    """The demo's host stamps times: describe shows them and since/until narrow the search."""
    from datetime import datetime, timezone

    c = demo.data["canaries"][0]
    t = demo.fed[next(x for x in demo.session.canaries if x.key == c["key"]).message_index]["timestamp"]
    iso = lambda v: datetime.fromtimestamp(v, tz=timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    assert json.loads(ok(lcm_at(demo, "describe", c["hit_id"], "--json")).stdout)["time"] == iso(t)

    def ids(*extra: str) -> list[str]:
        d = json.loads(ok(lcm_at(demo, "grep", c["value"], "--scope", "messages", "--json", *extra)).stdout)
        return [h["id"] for g in d["groups"] for h in g["hits"]]

    assert c["hit_id"] in ids("--since", iso(t - 60), "--until", iso(t + 60))
    assert c["hit_id"] not in ids("--since", iso(t + 60))
    assert c["hit_id"] not in ids("--until", iso(t - 60))
    assert "not an ISO time" in one_line_failure(lcm_at(demo, "grep", "x", "--since", "yesterday"), 1)
