"""Issue #43, encryption at rest of the SQLite store (SQLCipher through `sqlcipher3`): nothing
readable in the files, every command and the engine work with the key, one clear line and
nothing created without it or with a wrong one, encrypt → rekey → decrypt keeps the history,
and PostgreSQL's doctor names an unencrypted connection to a remote server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.ops.doctor import run_doctor
from lossless_context.store import open_store
from lossless_context.store.sqlite import cipher
from tests.test_cli import lcm_env, ok, one_line_failure


def run_lcm(*args: str, home: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = lcm_env(home)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "lossless_context.cli.commands", *args], capture_output=True,
                          text=True, env=env, cwd=str(home), timeout=300, stdin=subprocess.DEVNULL)

pytest.importorskip("sqlcipher3")  # the [test] extra installs it (the [encryption] extra for users)

KEY = "correct horse battery staple"
CANARY = "PLAINTEXT-CANARY-7731"


@pytest.fixture
def env(tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith("LCM_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    return monkeypatch


def _engine(location: str) -> LCMEngine:
    e = LCMEngine(config=LCMConfig.load({"store": location, "summarizer": "extractive"}, read_file=False))
    e.update_model("m", 24_000)
    return e


def _fill(location: str, sid: str = "s1") -> LCMEngine:
    e = _engine(location)
    e.bind_session_state(None, sid)
    hist = [{"role": "user", "content": f"remember {CANARY} please"}, {"role": "assistant", "content": "noted"}]
    for i in range(30):
        hist += [{"role": "user", "content": f"question {i} about topic_{i} " + "words of filler text " * 60},
                 {"role": "assistant", "content": f"answer {i} on topic_{i} " + "more filler text here " * 60}]
    out = e.compress(hist)
    assert out != hist
    e.on_session_start(sid, boundary_reason="compression", old_session_id=sid)
    e.on_session_end(sid, out + [{"role": "user", "content": "and the tail message TAILWORD-55"}])
    return e


def _grep(e: LCMEngine, q: str) -> list[str]:
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": q, "limit": 20}))
    assert "error" not in ans, ans
    return [h["id"] for g in ans["groups"] for h in g["hits"]]


def _raw_bytes(location: str) -> bytes:
    return b"".join(Path(location + s).read_bytes() for s in ("", "-wal") if Path(location + s).exists())


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def test_the_binding_has_fts5_trigram_and_its_errors_are_sqlite_errors():
    import sqlite3

    mod = cipher.driver()
    c = mod.connect(":memory:")
    c.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram')")
    c.execute("INSERT INTO t VALUES ('青龙七号暗号')")
    assert c.execute("SELECT COUNT(*) FROM t WHERE t MATCH '七号暗'").fetchone()[0] == 1
    # the store's `except sqlite3.OperationalError` (busy locks, outages) must catch these too
    with pytest.raises(sqlite3.OperationalError):
        c.execute("SELECT * FROM no_such_table")
    assert issubclass(mod.IntegrityError, sqlite3.IntegrityError)
    # the one limit the store reads (append.py sizes its statements by it); others refused as sqlite3 does
    conn = mod.connect(":memory:", factory=cipher._connection_class())
    assert conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) == 32_766
    with pytest.raises(sqlite3.ProgrammingError):
        conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    conn.close()


def test_an_encrypted_store_has_no_readable_byte_and_works_with_the_key(env, tmp_path):
    env.setenv("LCM_ENCRYPTION_KEY", KEY)
    loc = str(tmp_path / "lcm.db")
    e = _fill(loc)
    assert e.store.encrypted
    e.store.wait_indexed()
    raw = _raw_bytes(loc)
    assert not raw.startswith(cipher.SQLITE_MAGIC) and b"SQLite format 3" not in raw[:100]
    assert CANARY.encode() not in raw and b"TAILWORD-55" not in raw and b"filler" not in raw
    hits = _grep(e, CANARY)
    assert hits
    summary = next(h for h in hits if h.startswith("s")) if any(h.startswith("s") for h in hits) else None
    msg = next(h for h in hits if h.startswith("m"))
    exp = json.loads(e.handle_tool_call("lcm_expand", {"id": msg}))
    assert CANARY in json.dumps(exp)
    if summary:
        assert "children" in json.loads(e.handle_tool_call("lcm_expand", {"id": summary}))
    assert _grep(e, "TAILWORD-55")
    assert run_doctor(e.store).ok
    st = e.get_status()
    assert "lcm_store_error" not in st
    e.store.close()
    home = tmp_path / "h"
    home.mkdir()
    out = ok(run_lcm("--store", loc, "status", home=home, env_extra={"LCM_ENCRYPTION_KEY": KEY})).stdout
    assert "encrypted at rest: yes (SQLCipher)" in out
    assert CANARY in ok(run_lcm("--store", loc, "grep", CANARY, home=home, env_extra={"LCM_ENCRYPTION_KEY": KEY})).stdout
    view = tmp_path / "v.html"
    ok(run_lcm("--store", loc, "view", "-o", str(view), home=home, env_extra={"LCM_ENCRYPTION_KEY": KEY}))
    assert CANARY in view.read_text(encoding="utf-8")


@pytest.mark.parametrize("key", [None, "a wrong key"])
def test_without_the_key_every_command_fails_with_one_line_and_creates_nothing(env, tmp_path, key):
    env.setenv("LCM_ENCRYPTION_KEY", KEY)
    loc = str(tmp_path / "store" / "lcm.db")
    _fill(loc).store.close()
    env.delenv("LCM_ENCRYPTION_KEY")
    home = tmp_path / "h"
    home.mkdir()
    before = _files(tmp_path / "store")
    extra = {"LCM_ENCRYPTION_KEY": key} if key else {}
    for args in (["status"], ["sessions"], ["grep", CANARY], ["doctor"], ["export", "-o", str(tmp_path / "x.jsonl")],
                 ["backup", "-o", str(tmp_path / "b.db")], ["prune", "--older-than", "0", "--yes"], ["context"],
                 ["view", "-o", str(tmp_path / "v.html")], ["decrypt", "--yes"], ["rekey", "--yes"]):
        line = one_line_failure(run_lcm("--store", loc, *args, home=home, env_extra=extra))
        assert ("no key is set" in line) if key is None else ("does not open it" in line), (args, line)
        assert "no sessions" not in line and "empty" not in line
    assert _files(tmp_path / "store") == before  # nothing made beside the store (no -wal, -shm, copy)
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "b.db").exists()
    # the engine (inside Hermes): the store is unusable, the session goes on, and the reason is named
    if key:
        env.setenv("LCM_ENCRYPTION_KEY", key)
    e = _engine(loc)
    e.bind_session_state(None, "s2")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert e.compress(msgs) == msgs
    st = e.get_status()
    assert "encrypt" in st["lcm_store_error"] and ("no key" in st["lcm_store_error"] or "does not open" in
                                                   st["lcm_store_error"]), st["lcm_store_error"]
    ans = json.loads(e.handle_tool_call("lcm_grep", {"query": "hi"}))
    assert "unavailable" in json.dumps(ans)
    assert _files(tmp_path / "store") == before


def test_encrypt_rekey_decrypt_round_trip_keeps_every_search(env, tmp_path):
    loc = str(tmp_path / "lcm.db")
    _fill(loc).store.close()
    home = tmp_path / "h"
    home.mkdir()
    plain = _raw_bytes(loc)
    assert plain.startswith(cipher.SQLITE_MAGIC) and CANARY.encode() in plain

    def results(key: str | None) -> list:
        extra = {"LCM_ENCRYPTION_KEY": key} if key else {}
        out = []
        for q in (CANARY, "TAILWORD-55", "topic_7", "filler text"):
            data = json.loads(ok(run_lcm("--store", loc, "grep", q, "--json", "--limit", "50", home=home,
                                         env_extra=extra)).stdout)
            out.append([[h["id"], h.get("snippet")] for g in data["groups"] for h in g["hits"]])
        return out

    want = results(None)
    assert want[0] and want[1]
    assert "set the key first" in one_line_failure(run_lcm("--store", loc, "encrypt", "--yes", home=home))
    out = ok(run_lcm("--store", loc, "encrypt", "--yes", home=home, env_extra={"LCM_ENCRYPTION_KEY": KEY})).stdout
    assert "encrypted" in out
    raw = _raw_bytes(loc)
    assert not raw.startswith(cipher.SQLITE_MAGIC) and CANARY.encode() not in raw
    assert not Path(loc + "-wal").exists() and not Path(loc + "-shm").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".lcm")) == []  # no copy left behind
    assert results(KEY) == want
    # rekey: the old key no longer opens it, the new one does
    ok(run_lcm("--store", loc, "rekey", "--yes", home=home,
               env_extra={"LCM_ENCRYPTION_KEY": KEY, "LCM_NEW_ENCRYPTION_KEY": "k2"}))
    assert "does not open it" in one_line_failure(run_lcm("--store", loc, "status", home=home,
                                                          env_extra={"LCM_ENCRYPTION_KEY": KEY}))
    assert results("k2") == want
    ok(run_lcm("--store", loc, "decrypt", "--yes", home=home, env_extra={"LCM_ENCRYPTION_KEY": "k2"}))
    assert _raw_bytes(loc).startswith(cipher.SQLITE_MAGIC)
    assert results(None) == want
    assert "healthy" in ok(run_lcm("--store", loc, "doctor", home=home)).stdout


def test_encrypt_refuses_a_store_another_process_has_open(env, tmp_path):
    loc = str(tmp_path / "lcm.db")
    _fill(loc).store.close()
    holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]);"
                               " c.execute('SELECT COUNT(*) FROM messages').fetchone(); print('ready', flush=True);"
                               " time.sleep(60)", loc], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        home = tmp_path / "h"
        home.mkdir()
        line = one_line_failure(run_lcm("--store", loc, "encrypt", "--yes", home=home,
                                        env_extra={"LCM_ENCRYPTION_KEY": KEY}))
        assert f"open in process {holder.pid}" in line
        assert _raw_bytes(loc).startswith(cipher.SQLITE_MAGIC)
    finally:
        holder.kill()
        holder.wait()


def test_backups_and_exports_say_whether_they_are_encrypted(env, tmp_path):
    env.setenv("LCM_ENCRYPTION_KEY", KEY)
    loc = str(tmp_path / "lcm.db")
    _fill(loc).store.close()
    home = tmp_path / "h"
    home.mkdir()
    extra = {"LCM_ENCRYPTION_KEY": KEY}
    out = ok(run_lcm("--store", loc, "backup", "-o", str(tmp_path / "b.db"), home=home, env_extra=extra)).stdout
    assert "encrypted with the store's key" in out
    assert CANARY.encode() not in (tmp_path / "b.db").read_bytes()
    assert CANARY in ok(run_lcm("--store", str(tmp_path / "b.db"), "grep", CANARY, home=home, env_extra=extra)).stdout
    r = ok(run_lcm("--store", loc, "export", "-o", str(tmp_path / "e.jsonl"), home=home, env_extra=extra))
    assert "this export is not (plaintext JSONL)" in r.stderr
    assert (tmp_path / "e.jsonl").stat().st_mode & 0o077 == 0


def test_key_file_must_be_private(env, tmp_path):
    kf = tmp_path / "key"
    kf.write_text(KEY + "\n")
    os.chmod(kf, 0o644)
    loc = str(tmp_path / "lcm.db")
    home = tmp_path / "h"
    home.mkdir()
    (home / "config.yaml").write_text(f"lcm:\n  encryption_key_file: {kf}\n")
    env.setenv("LCM_ENCRYPTION_KEY_FILE", str(kf))
    with pytest.raises(cipher.CipherError, match="readable by others"):
        cipher.passphrase()
    os.chmod(kf, 0o600)
    e = _fill(loc)
    assert e.store.encrypted
    e.store.close()
    env.delenv("LCM_ENCRYPTION_KEY_FILE")
    # the config's key file (as Hermes' config.yaml names it) opens it too
    assert CANARY in ok(run_lcm("--store", loc, "grep", CANARY, home=home,
                                env_extra={"HERMES_HOME": str(home)})).stdout


def test_the_engine_imports_and_runs_without_the_binding(tmp_path):
    code = f"""
import sys, json
sys.modules['sqlcipher3'] = None  # not installed
from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
e = LCMEngine(config=LCMConfig.load({{'store': {str(tmp_path / 'plain.db')!r}, 'summarizer': 'extractive'}},
                                    read_file=False))
e.bind_session_state(None, 's')
e.on_session_end('s', [{{'role': 'user', 'content': 'hello PLAINWORD'}}])
print(json.loads(e.handle_tool_call('lcm_grep', {{'query': 'PLAINWORD'}}))['hits'])
import os
os.environ['LCM_ENCRYPTION_KEY'] = {KEY!r}
e2 = LCMEngine(config=LCMConfig.load({{'store': {str(tmp_path / 'enc.db')!r}, 'summarizer': 'extractive'}},
                                     read_file=False))
e2.bind_session_state(None, 's')
print(e2.get_status()['lcm_store_error'])
"""
    enc = tmp_path / "enc.db"
    enc.write_bytes(os.urandom(4096))  # an encrypted file, as far as anyone can tell
    env = {k: v for k, v in os.environ.items() if not k.startswith("LCM_")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "1" and "pip install 'lossless-context[encryption]'" in lines[1], r.stdout
    assert "cannot open store" in lines[1] and "is encrypted" in lines[1]


def test_doctor_names_an_unencrypted_connection_to_a_remote_server(pg_fresh_dsn):
    # the test server, reached by its address under a remote name (hostaddr): no TLS on it
    dsn = pg_fresh_dsn + ("&" if "?" in pg_fresh_dsn else "?") + "hostaddr=127.0.0.1"
    from urllib.parse import urlparse

    u = urlparse(pg_fresh_dsn)
    remote = dsn.replace(f"@{u.hostname}:", "@db.example.com:", 1) if "@" in dsn else dsn.replace(
        f"//{u.hostname}:", "//db.example.com:", 1)
    store = open_store(remote)
    try:
        store.ensure_session("s")
        rep = run_doctor(store)
        assert rep.ok
        text = rep.render_text()
        assert "NOT encrypted" in text and "sslmode=verify-full" in text, text
    finally:
        store.close()
    local = open_store(pg_fresh_dsn)
    try:
        text = run_doctor(local).render_text()
        assert "NOT encrypted" not in text and "server side (PostgreSQL on this machine" in text
    finally:
        local.close()


def test_lcm_mcp_serves_an_encrypted_store_with_the_key_only(env, tmp_path):
    """`lcm mcp` opens stores through the store factory: with the key it answers as over a
    plaintext store; without it the server refuses with the same clear reason."""
    pytest.importorskip("mcp")
    from tests.test_mcp import handshake, raw_server, server_cmd, server_env

    env.setenv("LCM_ENCRYPTION_KEY", KEY)
    loc = str(tmp_path / "lcm.db")
    _fill(loc, sid="alpha").store.close()
    home = tmp_path / "h"
    home.mkdir()
    with raw_server(server_cmd(loc, "--session", "alpha"), {**server_env(home), "LCM_ENCRYPTION_KEY": KEY}) as c:
        handshake(c)
        found, err = c.tool("lcm_grep", {"query": CANARY})
        assert not err and found["hits"], found
        mid = next(h["id"] for g in found["groups"] for h in g["hits"] if h["id"].startswith("m"))
        page, err = c.tool("lcm_expand", {"id": mid})
        assert not err and CANARY in json.dumps(page)
        assert c.close_stdin_and_wait() == 0
    r = subprocess.run(server_cmd(loc, "--session", "alpha"), env=server_env(home), input="", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 or "no key is set" in r.stdout + r.stderr, (r.returncode, r.stdout, r.stderr)
    assert "no key is set" in r.stderr + r.stdout


def test_a_copy_that_differs_is_never_swapped_in(env, tmp_path, monkeypatch):
    """encrypt checks its copy against the store: a copy missing rows is refused, the store
    is left as it was and the copy removed."""
    from lossless_context.store.sqlite import convert

    loc = str(tmp_path / "lcm.db")
    _fill(loc).store.close()
    before = Path(loc).read_bytes()
    real = cipher.export_to

    def lossy(src, dest, key):
        real(src, dest, key)
        c = cipher.connect(dest, key, isolation_level=None)
        c.execute("DELETE FROM message_retractions")
        c.execute("DELETE FROM context_items WHERE pos = (SELECT MAX(pos) FROM context_items)")
        c.close()

    monkeypatch.setattr(cipher, "export_to", lossy)
    with pytest.raises(convert.ConvertError, match="differs"):
        convert.convert(loc, None, KEY.encode())
    assert Path(loc).read_bytes()[:16] == before[:16] == cipher.SQLITE_MAGIC
    assert not [p for p in tmp_path.iterdir() if ".lcm-convert" in p.name]


def _opens_with(location: str, passphrase: str) -> list[str]:
    """Which page HMACs open the file, tried with the binding itself (not through the store)."""
    key = cipher.StoreKey.for_file(location, passphrase.encode())
    found = []
    for algorithm in ("HMAC_SHA1", "HMAC_SHA256", "HMAC_SHA512"):
        c = cipher.driver().connect(location)
        try:
            c.execute("PRAGMA cipher_log_level = NONE")
            c.execute(f"PRAGMA key = {key.pragma()}")
            c.execute(f"PRAGMA cipher_page_size = {cipher.CIPHER_PAGE_SIZE}")
            c.execute(f"PRAGMA cipher_hmac_algorithm = {algorithm}")
            c.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            found.append(algorithm)
        except Exception:
            pass
        finally:
            c.close()
    return found


def _as_sha512(location: str, passphrase: str) -> None:
    """Rewrite an encrypted store as SQLCipher 4's default page format (HMAC-SHA512), the form
    stores encrypted before HMAC-SHA256 have: same key, same salt, same rows."""
    key = cipher.StoreKey.for_file(location, passphrase.encode())
    old = location + ".sha512"
    src = cipher.connect(location, key)
    try:
        src.execute(f"ATTACH DATABASE ? AS old KEY {key.pragma()}", (old,))
        src.execute(f"PRAGMA old.cipher_page_size = {cipher.CIPHER_PAGE_SIZE}")
        src.execute("PRAGMA old.cipher_hmac_algorithm = HMAC_SHA512")
        src.execute("SELECT sqlcipher_export('old')").fetchall()
        src.execute(f"PRAGMA old.user_version = {int(src.execute('PRAGMA main.user_version').fetchone()[0])}")
        src.execute("DETACH DATABASE old")
    finally:
        src.close()
    for suffix in ("-wal", "-shm"):
        Path(location + suffix).unlink(missing_ok=True)
    os.replace(old, location)


def test_new_files_check_pages_with_sha256_and_older_sha512_files_still_open(env, tmp_path):
    """Files are made with HMAC-SHA256 pages (half the per-page cost of SQLCipher's default
    HMAC-SHA512); a file made before opens, searches and takes writes as it is, a wrong key
    still fails after both formats were tried, and `lcm rekey` rewrites it in the new form."""
    env.setenv("LCM_ENCRYPTION_KEY", KEY)
    loc = str(tmp_path / "lcm.db")
    e = _fill(loc)
    e.store.wait_indexed()
    e.store.close()
    assert _opens_with(loc, KEY) == ["HMAC_SHA256"]

    _as_sha512(loc, KEY)
    assert _opens_with(loc, KEY) == ["HMAC_SHA512"]
    e2 = _engine(loc)
    e2.bind_session_state(None, "s1")
    assert CANARY in json.dumps(json.loads(e2.handle_tool_call("lcm_expand", {"id": _grep(e2, CANARY)[0]})))
    e2.on_session_end("s1", [{"role": "user", "content": "a new turn NEWWORD-8812 after the upgrade"}])
    e2.store.wait_indexed()
    assert _grep(e2, "NEWWORD-8812")
    e2.store.close()
    assert _opens_with(loc, KEY) == ["HMAC_SHA512"]  # (kept in its format: no silent rewrite)

    home = tmp_path / "h"
    home.mkdir()
    assert "does not open it" in one_line_failure(run_lcm("--store", loc, "status", home=home,
                                                          env_extra={"LCM_ENCRYPTION_KEY": "a wrong key"}))
    ok(run_lcm("--store", loc, "rekey", "--yes", home=home,
               env_extra={"LCM_ENCRYPTION_KEY": KEY, "LCM_NEW_ENCRYPTION_KEY": "k2"}))
    assert _opens_with(loc, "k2") == ["HMAC_SHA256"]
    out = ok(run_lcm("--store", loc, "grep", "NEWWORD-8812", home=home, env_extra={"LCM_ENCRYPTION_KEY": "k2"}))
    assert "NEWWORD-8812" in out.stdout
