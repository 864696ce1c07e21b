"""Secrets: stored verbatim (lossless), never sent to a summariser, never in a summary.

Canary secrets of many kinds (API keys of several vendors, bearer tokens and JWTs, PEM
private keys, passwords in assignments, credentials in URLs) are planted in user messages,
tool outputs and tool-call arguments of a long coding session, and in the
memory-provider context. The session is compacted by a host simulator with
``summarizer: openai`` against a local fake server, then ``lcm_expand_query`` is asked
about them. None of the secrets appears in any request body the server recorded, nor in
any summary text in the store (published or staged); the verbatim store still holds every
one of them; the store file is 0600 and its directory (and the ``.locks`` directory) 0700.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest

from lossless_context import LCMEngine
from lossless_context.config import LCMConfig
from lossless_context.demo.sessions import coding_session
from tests.support.fake_openai import FakeOpenAI, SummariserResponder
from lossless_context.demo.host_driver import R19Host
from tests.test_hostile_input import record_counts

# (kind, the secret itself, how it is planted in text). The secret must never leave the store.
PEM_BODY = ("MIIEowIBAAKCAQEAzCanaryPemBodyLine1Xq7Lm2Nn3Oo4Pp5Qq6Rr7Ss8Tt9Uu0VvWwXxYyZz1\n"
            "bQ2cR3dS4eT5fU6gV7hW8iX9jY0kZ1lA2mB3nC4oD5pE6qF7rG8sH9tI0uJ1vK2wL3xM4yN5zCanaryEnd")
SECRETS: list[tuple[str, str, str]] = [
    ("openai", "sk-proj-CanaryA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0", "export OPENAI_API_KEY={s}"),
    ("anthropic", "sk-ant-api03-CanaryZ9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2H1g0-AbCdEf", "ANTHROPIC_API_KEY={s}"),
    ("github", "ghp_CanaryQ1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6", "git remote set-url origin https://{s}@github.com/acme/ledger.git"),
    ("aws_id", "AKIAQ7CANARY5EXAMPL2", "aws_access_key_id = {s}"),
    ("aws_secret", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYCanary9KEYz", "aws_secret_access_key = {s}"),
    ("slack", "xoxb-123456789012-1234567890123-CanarySlackTokenAbCdEf", "SLACK_BOT_TOKEN: {s}"),
    ("google", "AIzaSyCanary-0123456789abcdefGHIJKLMNOPQ", "const key = \"{s}\";"),
    ("stripe", "sk_live_CanaryStripe51HxYzAbCdEfGhIjKlMnOp", "STRIPE_SECRET={s}"),
    ("bearer", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.CanarySigABCdef123456789xyz",
     "curl -H 'Authorization: Bearer {s}' https://api.acme.test/v1/ledger"),
    ("opaque_bearer", "CanaryOpaqueBearer7f3a9c2e1d4b8a6f", "Authorization: Bearer {s}"),
    ("pem", PEM_BODY.split("\n")[0][20:60],
     "-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----"),
    ("pem2", PEM_BODY.split("\n")[1][10:50], ""),  # the second body line (planted with "pem")
    ("password_assign", "Tr0ub4dor-Canary-Horse-Staple", "DB_PASSWORD=\"{s}\""),
    ("password_json", "Canary#Json!Pa55word-2026", "{{\"username\": \"admin\", \"password\": \"{s}\"}}"),
    ("password_yaml", "CanaryYamlSecretValue-77", "  password: {s}"),
    ("url_creds", "S3cretCanaryUrlPass99", "DATABASE_URL=postgres://ledger_admin:{s}@db.internal:5432/ledger"),
    ("hf", "hf_CanaryHuggingFaceTokenAbCdEfGhIjKlMnOpQr", "HF_TOKEN={s}"),
]


def _planted(kind_filter=None) -> list[tuple[str, str, str]]:
    return [(k, s, t) for k, s, t in SECRETS if t and (kind_filter is None or k in kind_filter)]


def _plant(msgs: list[dict]) -> list[dict]:
    """Secrets in user messages, tool outputs and tool-call arguments of the early session."""
    msgs = copy.deepcopy(msgs)
    lines = [t.format(s=s) for _, s, t in _planted()]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    tools = [i for i, m in enumerate(msgs) if m["role"] == "tool"]
    calls = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and m.get("tool_calls")]
    assert len(users) > 10 and len(tools) > 10 and len(calls) > 10
    for k, line in enumerate(lines):
        where = k % 3
        if where == 0:  # a user pasting config
            i = users[1 + k // 3]
            msgs[i]["content"] = f"{msgs[i]['content']}\nHere is my config:\n{line}\nplease keep it safe."
        elif where == 1:  # a tool printing a file with it
            i = tools[2 + k // 3]
            msgs[i]["content"] = f"$ cat .env\n{line}\n" + str(msgs[i]["content"])
        else:  # the model passing it in a tool call's arguments
            i = calls[2 + k // 3]
            fn = msgs[i]["tool_calls"][0]["function"]
            args = json.loads(fn["arguments"]) if fn["arguments"] else {}
            args["env_snippet"] = line
            fn["arguments"] = json.dumps(args)
    # and everything once more, in one late tool output (the tail, then compacted later)
    j = tools[len(tools) // 2]
    msgs[j]["content"] = "\n".join(lines) + "\n" + str(msgs[j]["content"])
    return msgs


def _leaks(text: str) -> list[str]:
    found = []
    for kind, s, _ in SECRETS:
        variants = {s, json.dumps(s)[1:-1], s.replace("/", "\\/")}
        if any(v in text for v in variants):
            found.append(kind)
    return found


@pytest.fixture(scope="module")
def compacted(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    store_dir = home / "lcm"
    msgs = _plant(coding_session(700, seed=13).messages)
    memory = "User prefers short answers. Their staging DB_PASSWORD=\"Tr0ub4dor-Canary-Horse-Staple\"."
    with FakeOpenAI(responder=SummariserResponder(max_chars=1400)) as srv:
        cfg = LCMConfig.load({"store": str(store_dir / "lcm.db"), "summarizer": "openai",
                              "summary_base_url": srv.base_url, "summary_model": "summ",
                              "fresh_tail_tokens": 3000, "leaf_chunk_tokens": 3000, "threshold": 0.3,
                              "soft_threshold": 0.2, "breaker_failures": 1000, "max_summarizer_calls": 10**6},
                             read_file=False)
        e = LCMEngine(config=cfg)
        host = R19Host(e, session_id="sec-1")
        host.start(context_length=64_000)
        orig = e.compress

        def with_memory(messages, *a, **kw):  # a memory provider adds (unredacted) context
            kw.setdefault("memory_context", memory)
            return orig(messages, *a, **kw)

        e.compress = with_memory
        for i in range(0, len(msgs), 12):
            host.add(*msgs[i:i + 12])
            host.maybe_compress()
        host.maybe_compress(force=True, focus="the deploy configuration")
        host.end()
        compaction_requests = list(srv.chat_requests)
        # the agent asks about the secrets: excerpts go to the model
        answers = [e.handle_tool_call("lcm_expand_query", {"prompt": q, "query": qq, "max_tokens": 8000})
                   for q, qq in (("What is the database password?", "DB_PASSWORD"),
                                 ("Which API keys were configured?", "API_KEY"),
                                 ("What private key was pasted?", "PRIVATE KEY"),
                                 ("Which bearer token did curl use?", "Authorization Bearer"),
                                 ("What is the postgres URL?", "DATABASE_URL postgres"))]
        all_requests = list(srv.chat_requests)
    yield {"engine": e, "host": host, "msgs": msgs, "compaction_requests": compaction_requests,
           "all_requests": all_requests, "answers": answers, "store_dir": store_dir}
    e.store.close()


def test_no_secret_reaches_the_summariser(compacted):
    reqs = compacted["compaction_requests"]
    assert compacted["host"].compactions >= 3 and len(reqs) >= 5, "the session was compacted with the model"
    bodies = [r.raw.decode("utf-8", "replace") for r in reqs]
    leaked = {k for b in bodies for k in _leaks(b)}
    assert not leaked, f"secrets sent to the summariser: {sorted(leaked)}"
    # the transcripts sent did carry the planted lines' context (the test is not vacuous)
    assert any("DATABASE_URL" in b or "OPENAI_API_KEY" in b for b in bodies)
    record_counts("secrets", {"secret_kinds": len(SECRETS), "summariser_requests_checked": len(bodies),
                              "leaks_found": len(leaked)})


def test_no_secret_in_expand_query_requests_or_answers(compacted):
    extra = compacted["all_requests"][len(compacted["compaction_requests"]):]
    assert extra, "lcm_expand_query asked the model"
    leaked = {k for r in extra for k in _leaks(r.raw.decode("utf-8", "replace"))}
    assert not leaked, f"secrets sent with lcm_expand_query: {sorted(leaked)}"
    for a in compacted["answers"]:
        data = json.loads(a)
        assert "answer" in data, data
        assert not _leaks(data["answer"])


def test_no_secret_in_any_summary(compacted):
    e = compacted["engine"]
    rows = e.store.conn().execute("SELECT id, state, text FROM summaries").fetchall()
    assert rows and any(st == "published" for _, st, _ in rows)
    bad = {(f"s{i}", st, k) for i, st, text in rows for k in _leaks(text)}
    assert not bad, f"secrets in summary text: {sorted(bad)[:10]}"
    # nor in the exploration summaries of large messages (shown to the model)
    ex = e.store.conn().execute("SELECT id, exploration FROM messages WHERE exploration IS NOT NULL").fetchall()
    assert not {k for _, x in ex for k in _leaks(x or "")}


def test_verbatim_store_still_holds_every_secret(compacted):
    e = compacted["engine"]
    raws = "\n".join(json.dumps(m.raw) for m in e.store.iter_all_messages())
    missing = [k for k, s, _ in SECRETS if json.dumps(s)[1:-1] not in raws]
    assert not missing, f"the store lost the verbatim secret(s): {missing}"
    stored = [json.dumps(m.raw, sort_keys=True) for m in e.store.iter_all_messages()]
    assert sorted(stored) == sorted(json.dumps(m, sort_keys=True) for m in compacted["msgs"])
    # and the agent can still recover one verbatim through the tools (it is its own history)
    hit = json.loads(e.handle_tool_call("lcm_grep", {"query": "S3cretCanaryUrlPass99"}))
    assert hit["hits"] >= 1


def test_store_files_are_private(compacted):
    d = compacted["store_dir"]
    db = d / "lcm.db"
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    for suffix in ("-wal", "-shm"):
        p = Path(str(db) + suffix)
        if p.exists():
            assert stat.S_IMODE(os.stat(p).st_mode) & 0o077 == 0, f"{p.name} readable by others"
    locks = Path(str(db) + ".locks")
    assert locks.is_dir(), "compactions took the per-session lock"
    assert stat.S_IMODE(os.stat(locks).st_mode) == 0o700
    for f in locks.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) & 0o077 == 0


def test_secret_in_focus_topic_or_question_is_not_sent(tmp_path):
    """What the user types as a /compress focus or the agent asks is redacted too."""
    secret = "sk-ant-api03-FocusCanary0123456789abcdefABCDEFghij"
    msgs = coding_session(300, seed=4).messages
    with FakeOpenAI(responder=SummariserResponder(max_chars=900)) as srv:
        e = LCMEngine(config=LCMConfig.load({"store": str(tmp_path / "lcm.db"), "summarizer": "openai",
                                             "summary_base_url": srv.base_url, "summary_model": "summ",
                                             "breaker_failures": 1000, "max_summarizer_calls": 10**6},
                                            read_file=False))
        e.update_model(model="m", context_length=64_000)
        e.on_session_start("f1")
        out = e.compress(copy.deepcopy(msgs), force=True, focus_topic=f"the key {secret}",
                         memory_context=f"api key: {secret}")
        assert out != msgs
        e.handle_tool_call("lcm_expand_query", {"prompt": f"where did I use {secret}?", "query": "pytest"})
        bodies = [r.raw.decode("utf-8", "replace") for r in srv.chat_requests]
    assert bodies
    assert not any(secret in b for b in bodies), "a secret typed as focus/question reached the model"
