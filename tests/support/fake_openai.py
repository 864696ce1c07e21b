"""A small OpenAI-compatible HTTP server for offline tests (stdlib only).

Usage::

    from tests.support.fake_openai import FakeOpenAI, ChatResponder

    with FakeOpenAI(responder=ChatResponder(reply_chars=4000)) as srv:
        srv.base_url          # "http://127.0.0.1:PORT/v1"
        ...                   # point a client / Hermes at it
        srv.requests          # every request seen (RecordedRequest), a copy
        srv.chat_requests     # only POST .../chat/completions

Endpoints
---------
* ``POST /v1/chat/completions`` and ``POST /chat/completions`` -- non-streaming
  and streaming (``"stream": true`` -> SSE ``data: {...}`` chunks, a final
  usage-only chunk when ``stream_options.include_usage`` is set, then
  ``data: [DONE]``).  The real Hermes host (0.19.0) streams by default and
  always sends ``stream_options: {"include_usage": true}``.
* ``GET /v1/models`` and ``GET /models`` -- a model list; each entry carries
  ``context_length`` / ``max_model_len`` / ``context_window``.
* ``GET /v1/models/<id>`` -- one model.
* Anything else -> 404 JSON (still recorded, so tests can see stray probes).

Replies are produced by a ``responder(request_json) -> Reply`` callable.
Shipped responders:

* :class:`ChatResponder` -- deterministic long-ish replies with realistic usage.
* :class:`ScriptedResponder` -- emits ``tool_calls`` on chosen turns, then answers
  normally once the tool results are in.
* :class:`SummariserResponder` -- a deterministic "summary" of the request text
  (keeps lines with digits / paths / identifiers, bounded).
* :class:`Router` -- sends summariser-looking requests to one responder and the
  rest to another (``looks_like_summary_request``).
* :class:`FailureSequence` + :class:`Fail` -- failure injection per call:
  HTTP 429/500/400, delays, empty content, refusal, reasoning-only, a reply
  longer than the input, a connection dropped mid-response.

Note: the ``openai`` client retries 429/5xx/connection errors by itself
(``max_retries``, 2 by default), and so do the host's helpers; every retry is a
separate call and consumes a step of a :class:`FailureSequence`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

__all__ = [
    "FakeOpenAI",
    "Reply",
    "ToolCall",
    "RecordedRequest",
    "ChatResponder",
    "ScriptedResponder",
    "SummariserResponder",
    "Router",
    "FailureSequence",
    "Fail",
    "Delay",
    "looks_like_summary_request",
    "summary_source_text",
    "SUMMARY_SOURCE_MARKERS",
    "request_text",
    "message_text",
    "prompt_tokens_for",
    "estimate_tokens",
    "last_message",
    "DEFAULT_MODEL",
    "DEFAULT_CONTEXT_LENGTH",
]

DEFAULT_MODEL = "fake-model"
DEFAULT_CONTEXT_LENGTH = 64000

REFUSAL_TEXT = "I'm sorry, I can't help with that."


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


@dataclass
class ToolCall:
    """A tool call the fake model makes.  ``arguments`` may be a dict or a raw JSON string."""

    name: str
    arguments: Union[Dict[str, Any], str] = field(default_factory=dict)
    id: Optional[str] = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, sort_keys=True)


@dataclass
class Reply:
    """What the fake server answers to one chat-completions call.

    ``usage=None`` means "compute it" (prompt ~ chars/4 of the request messages,
    completion ~ chars/4 of the reply).  ``status != 200`` sends an error body
    instead.  ``drop_after_bytes`` (>= 0) sends the response headers and that
    many bytes of the body, then closes the socket (connection dropped
    mid-response).  ``delay`` sleeps before answering; ``chunk_delay`` sleeps
    between SSE chunks.
    """

    content: Optional[str] = ""
    tool_calls: Optional[List[ToolCall]] = None
    reasoning_content: Optional[str] = None
    finish_reason: Optional[str] = None  # default: "tool_calls" if tool_calls else "stop"
    usage: Optional[Dict[str, Any]] = None
    status: int = 200
    error_message: Optional[str] = None
    error_type: Optional[str] = None
    headers: Dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    chunk_delay: float = 0.0
    stream_chunks: int = 4  # how many content pieces when streaming
    drop_after_bytes: int = -1
    raw_body: Optional[Union[bytes, str, dict]] = None  # sent verbatim (non-stream), overrides all

    def with_(self, **changes: Any) -> "Reply":
        r = copy.copy(self)
        for k, v in changes.items():
            setattr(r, k, v)
        return r


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: Dict[str, str]
    body: Any  # parsed JSON, or None
    raw: bytes
    time: float
    index: int  # 0-based arrival order over all requests

    @property
    def json(self) -> Any:
        return self.body

    @property
    def messages(self) -> List[Dict[str, Any]]:
        if isinstance(self.body, dict):
            return list(self.body.get("messages") or [])
        return []

    @property
    def is_chat(self) -> bool:
        return self.method == "POST" and self.path.rstrip("/").endswith("/chat/completions")

    @property
    def stream(self) -> bool:
        return bool(isinstance(self.body, dict) and self.body.get("stream"))

    @property
    def tool_names(self) -> List[str]:
        out = []
        for t in (self.body or {}).get("tools") or [] if isinstance(self.body, dict) else []:
            fn = (t or {}).get("function") or {}
            if fn.get("name"):
                out.append(fn["name"])
        return out


Responder = Callable[[Dict[str, Any]], Reply]


# ---------------------------------------------------------------------------
# Helpers on request JSON
# ---------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                if isinstance(p.get("text"), str):
                    parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
        return "\n".join(parts)
    return str(content)


def message_text(msg: Dict[str, Any]) -> str:
    """The provider-visible text of one message (content + tool-call arguments)."""
    parts = [_content_text(msg.get("content"))]
    for tc in msg.get("tool_calls") or []:
        fn = (tc or {}).get("function") or {}
        parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    return "\n".join(p for p in parts if p)


def request_text(req: Dict[str, Any], *, include_system: bool = True) -> str:
    """All message text of a chat request, joined by newlines."""
    out = []
    for m in req.get("messages") or []:
        if not include_system and m.get("role") == "system":
            continue
        out.append(message_text(m))
    return "\n".join(out)


def estimate_tokens(text_or_chars: Union[str, int]) -> int:
    n = text_or_chars if isinstance(text_or_chars, int) else len(text_or_chars)
    return max(1, (n + 3) // 4)


def prompt_tokens_for(req: Dict[str, Any], *, count_tools: bool = True,
                      tokenizer: Optional[Callable[[str], int]] = None) -> int:
    """~chars/4 of the messages (all JSON-visible text) plus, optionally, the tool schemas;
    with ``tokenizer``, that function's count of the same text (a provider's own tokenizer)."""
    if tokenizer is not None:
        texts = [message_text(m) for m in req.get("messages") or []]
        if count_tools and req.get("tools"):
            texts.append(json.dumps(req["tools"]))
        return sum(tokenizer(t) + 1 for t in texts)
    chars = 0
    for m in req.get("messages") or []:
        chars += len(message_text(m)) + 4  # a few tokens of per-message framing
    if count_tools and req.get("tools"):
        chars += len(json.dumps(req["tools"]))
    return estimate_tokens(chars)


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
_WORDLIKE = re.compile(r"[A-Za-z0-9_]+")


def dense_tokens(text: str) -> int:
    """A tokenizer denser than chars/4 everywhere, as real ones are for some scripts: one
    token per CJK character (≈4x chars/4), a word per 4 characters, and every other
    non-space character (code's brackets, operators, punctuation) a token of its own."""
    cjk = len(_CJK.findall(text))
    words = sum((len(w) + 3) // 4 for w in _WORDLIKE.findall(text))
    other = sum(1 for ch in _WORDLIKE.sub("", _CJK.sub("", text)) if not ch.isspace())
    return cjk + words + other


def last_message(req: Dict[str, Any], role: Optional[str] = None) -> Optional[Dict[str, Any]]:
    msgs = req.get("messages") or []
    for m in reversed(msgs):
        if role is None or m.get("role") == role:
            return m
    return None


_SUMMARY_WORDS = re.compile(r"summar|compact|condens|checkpoint|handoff", re.I)


def looks_like_summary_request(req: Dict[str, Any]) -> bool:
    """Heuristic: is this a summariser call rather than a main-agent turn?

    Hermes' main loop sends its own system prompt ("You are Hermes Agent, ...")
    and, whenever any tool is enabled, ``tools``; the built-in compressor's
    summary call (one user message, "You are a summarization agent creating a
    context checkpoint...") and an engine's ``call_llm(task="compression")``
    calls carry neither.  So: no ``tools``, not the Hermes identity prompt, and
    the instructions (first two messages or the tail of the last one) talk
    about summarising / compacting / condensing / checkpoints / handoffs.
    """
    if req.get("tools"):
        return False
    msgs = req.get("messages") or []
    if msgs and msgs[0].get("role") == "system" and "You are Hermes Agent" in _content_text(msgs[0].get("content"))[:400]:
        return False
    head = "\n".join(message_text(m)[:4000] for m in msgs[:2]) + "\n" + (
        message_text(msgs[-1])[-4000:] if msgs else ""
    )
    return bool(_SUMMARY_WORDS.search(head))


# (start, end) markers that delimit the transcript inside a summariser prompt.
# The first is the built-in compressor's prompt (agent/context_compressor.py).
SUMMARY_SOURCE_MARKERS: List[tuple] = [
    ("TURNS TO SUMMARIZE:", "Use this exact structure:"),
    ("<conversation>", "</conversation>"),
    ("<transcript>", "</transcript>"),
    ("<messages>", "</messages>"),
    ("<source>", "</source>"),
]


def summary_source_text(req: Dict[str, Any]) -> str:
    """The part of a summariser request that is transcript, not instructions.

    Non-system message text; if it contains one of SUMMARY_SOURCE_MARKERS, only
    the text between the markers (all such spans).
    """
    text = request_text(req, include_system=False)
    for start, end in SUMMARY_SOURCE_MARKERS:
        if start in text:
            spans = []
            for chunk in text.split(start)[1:]:
                spans.append(chunk.split(end, 1)[0])
            return "\n".join(spans)
    return text


def _usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, Any]:
    return {
        "prompt_tokens": int(prompt_tokens),
        "completion_tokens": int(completion_tokens),
        "total_tokens": int(prompt_tokens) + int(completion_tokens),
    }


def _reply_text_tokens(reply: Reply) -> int:
    chars = len(reply.content or "") + len(reply.reasoning_content or "")
    for tc in reply.tool_calls or []:
        chars += len(tc.name) + len(tc.arguments_json())
    return estimate_tokens(chars) if chars else 0


# ---------------------------------------------------------------------------
# Responders
# ---------------------------------------------------------------------------

_WORDS = (
    "the agent inspected module config value parser handler request cache table index "
    "migration build test release branch commit schema token window budget summary store"
).split()


class ChatResponder:
    """Deterministic chat replies of about ``reply_chars`` characters.

    Each reply names the call number and quotes a digest of the last user
    message, contains a few identifiers / paths / numbers (so summarisers have
    something to keep), and comes with ``usage`` computed from the request
    (``prompt_tokens`` ~ chars/4 of messages [+ tools], ``completion_tokens`` ~
    chars/4 of the reply).  ``prompt_token_scale`` multiplies prompt_tokens
    (to make a conversation look bigger to the host than it is).
    """

    def __init__(
        self,
        reply_chars: int = 1200,
        *,
        count_tools: bool = True,
        prompt_token_scale: float = 1.0,
        prefix: str = "Answer",
        tokenizer: Optional[Callable[[str], int]] = None,
    ) -> None:
        self.reply_chars = int(reply_chars)
        self.count_tools = count_tools
        self.tokenizer = tokenizer
        self.prompt_token_scale = float(prompt_token_scale)
        self.prefix = prefix
        self.calls = 0
        self._lock = threading.Lock()

    def text_for(self, req: Dict[str, Any], n: int) -> str:
        user = last_message(req, "user")
        utext = _content_text(user.get("content")) if user else ""
        digest = hashlib.sha1(utext.encode("utf-8", "replace")).hexdigest()[:10]
        head = f"{self.prefix} #{n} to [{utext[:80]}] (digest {digest})."
        lines = [head]
        i = 0
        while sum(len(x) + 1 for x in lines) < self.reply_chars:
            w = [_WORDS[(n * 7 + i * 3 + k) % len(_WORDS)] for k in range(8)]
            if i % 4 == 1:
                lines.append(f"Step {n}.{i}: edited src/module_{n}_{i}.py at line {100 + i} ({' '.join(w[:4])}).")
            elif i % 4 == 3:
                lines.append(f"Note {n}.{i}: value_{n}_{i} = {n * 1000 + i}; " + " ".join(w))
            else:  # numbered: a reply never repeats a line (newer hosts cut a stream that loops)
                lines.append(" ".join(w).capitalize() + f" ({n}.{i}).")
            i += 1
        return "\n".join(lines)[: max(self.reply_chars, len(head))]

    def __call__(self, req: Dict[str, Any]) -> Reply:
        with self._lock:
            self.calls += 1
            n = self.calls
        text = self.text_for(req, n)
        pt = int(prompt_tokens_for(req, count_tools=self.count_tools, tokenizer=self.tokenizer)
                 * self.prompt_token_scale)
        return Reply(content=text, usage=_usage(pt, estimate_tokens(text)))


class ScriptedResponder:
    """Emit ``tool_calls`` on chosen user turns, answer normally otherwise.

    ``script`` maps a *turn key* to a list of rounds; each round is a
    :class:`ToolCall` or a list of them (parallel calls in one assistant
    message).  A turn key is either an ``int`` (1-based number of the user
    turn, counted on requests whose last message has role ``user``) or a
    ``str`` (a substring of the last user message).  After the last round's
    tool results arrive, the reply comes from ``then`` (a ChatResponder by
    default).  Every request also gets realistic ``usage``.

    ``self.tool_results`` records the tool messages seen (for assertions).
    Note: a retried request (after an injected failure) that ends with the
    same user message counts as a new turn; put failures for the main loop
    behind a :class:`Router` or script turns by substring.
    """

    def __init__(
        self,
        script: Optional[Dict[Union[int, str], Any]] = None,
        *,
        then: Optional[Responder] = None,
        count_tools: bool = True,
        tokenizer: Optional[Callable[[str], int]] = None,
    ) -> None:
        self.script = dict(script or {})
        self.then = then or ChatResponder(reply_chars=400, tokenizer=tokenizer)
        self.count_tools = count_tools
        self.tokenizer = tokenizer
        self.turn = 0
        self.tool_results: List[Dict[str, Any]] = []
        self._pending: List[List[ToolCall]] = []
        self._lock = threading.Lock()
        self._ids = 0

    def _rounds_for(self, turn: int, user_text: str) -> List[List[ToolCall]]:
        plan = None
        if turn in self.script:
            plan = self.script[turn]
        else:
            for k, v in self.script.items():
                if isinstance(k, str) and k in user_text:
                    plan = v
                    break
        if plan is None:
            return []
        if isinstance(plan, ToolCall):
            plan = [plan]
        rounds = []
        for r in plan:
            rounds.append([r] if isinstance(r, ToolCall) else list(r))
        return rounds

    def __call__(self, req: Dict[str, Any]) -> Reply:
        msgs = req.get("messages") or []
        last = msgs[-1] if msgs else {}
        if not req.get("stream") and not req.get("tools"):
            # a host's auxiliary call (0.22 titles each session: non-streamed, no tools) is no
            # turn of the agent loop: answer it without touching the script
            return self.then(req)
        with self._lock:
            if last.get("role") == "tool":
                # collect the trailing tool results
                for m in reversed(msgs):
                    if m.get("role") != "tool":
                        break
                    self.tool_results.append(m)
            elif last.get("role") == "user":
                self.turn += 1
                self._pending = self._rounds_for(self.turn, _content_text(last.get("content")))
            nxt = self._pending.pop(0) if (self._pending and last.get("role") in ("user", "tool")) else None
            if nxt is not None:
                calls = []
                for tc in nxt:
                    self._ids += 1
                    calls.append(ToolCall(tc.name, tc.arguments, tc.id or f"call_fake_{self._ids}"))
        pt = prompt_tokens_for(req, count_tools=self.count_tools, tokenizer=self.tokenizer)
        if nxt is not None:
            r = Reply(content="", tool_calls=calls)
            r.usage = _usage(pt, _reply_text_tokens(r))
            return r
        r = self.then(req)
        if r.usage is None:
            r.usage = _usage(pt, _reply_text_tokens(r))
        return r


_KEEP_LINE = re.compile(
    r"\d"  # numbers
    r"|[\w.-]*/[\w./-]+"  # paths
    r"|\b[A-Za-z]+_[A-Za-z0-9_]+\b"  # snake_case identifiers
    r"|\b[a-z]+[A-Z][A-Za-z0-9]+\b"  # camelCase
    r"|\b[A-Z][a-z]+[A-Z][A-Za-z0-9]+\b"  # PascalCase with 2 humps
    r"|\w+\.\w+\(",  # calls
)


class SummariserResponder:
    """A deterministic "summary" of the request text, without a model.

    Takes :func:`summary_source_text` (or ``extract(req)``), keeps the
    distinct lines that contain digits, paths or identifiers, each cut to
    ``line_chars``, under a ``header`` line, and stops at ``max_chars``.  The
    result is never longer than ``max_chars``.  ``calls`` counts calls and
    ``inputs`` keeps the extracted source text of each call.
    """

    def __init__(
        self,
        max_chars: int = 1500,
        *,
        header: str = "Summary of earlier conversation:",
        line_chars: int = 160,
        extract: Optional[Callable[[Dict[str, Any]], str]] = None,
    ) -> None:
        self.max_chars = int(max_chars)
        self.header = header
        self.line_chars = int(line_chars)
        self.extract = extract or summary_source_text
        self.calls = 0
        self.inputs: List[str] = []
        self._lock = threading.Lock()

    def summarise(self, text: str) -> str:
        seen = set()
        out = [self.header]
        size = len(self.header)
        for raw in text.splitlines():
            line = raw.strip()
            if not line or not _KEEP_LINE.search(line):
                continue
            line = line[: self.line_chars]
            if line in seen:
                continue
            seen.add(line)
            if size + 3 + len(line) > self.max_chars:
                break
            out.append("- " + line)
            size += len(line) + 3
        if len(out) == 1:
            out.append("- (no identifiers found)")
        return "\n".join(out)[: self.max_chars]

    def __call__(self, req: Dict[str, Any]) -> Reply:
        text = self.extract(req)
        with self._lock:
            self.calls += 1
            self.inputs.append(text)
        summary = self.summarise(text)
        return Reply(content=summary, usage=_usage(prompt_tokens_for(req), estimate_tokens(summary)))


class Router:
    """Dispatch to ``summariser`` when ``predicate(req)`` (default: looks_like_summary_request), else ``chat``."""

    def __init__(
        self,
        chat: Optional[Responder] = None,
        summariser: Optional[Responder] = None,
        predicate: Callable[[Dict[str, Any]], bool] = looks_like_summary_request,
    ) -> None:
        self.chat = chat or ChatResponder()
        self.summariser = summariser or SummariserResponder()
        self.predicate = predicate
        self.summary_calls = 0
        self.chat_calls = 0
        self._lock = threading.Lock()

    def __call__(self, req: Dict[str, Any]) -> Reply:
        if self.predicate(req):
            with self._lock:
                self.summary_calls += 1
            return self.summariser(req)
        with self._lock:
            self.chat_calls += 1
        return self.chat(req)


# ---------------------------------------------------------------------------
# Failure injection
# ---------------------------------------------------------------------------


@dataclass
class Delay:
    """A step of a FailureSequence: answer like the base responder (or ``reply``), ``seconds`` late."""

    seconds: float
    reply: Optional[Reply] = None


class Fail:
    """Factories for failure steps (use them in a :class:`FailureSequence` or return them directly)."""

    @staticmethod
    def http(status: int, message: Optional[str] = None, *, retry_after: Optional[float] = None,
             error_type: Optional[str] = None) -> Reply:
        default = {
            400: ("Bad request: invalid messages", "invalid_request_error"),
            401: ("Invalid API key", "authentication_error"),
            404: ("Not found", "not_found_error"),
            413: ("Request too large", "invalid_request_error"),
            429: ("Rate limit exceeded, retry later", "rate_limit_error"),
            500: ("Internal server error", "server_error"),
            502: ("Bad gateway", "server_error"),
            503: ("Service unavailable", "server_error"),
        }.get(status, (f"HTTP {status}", "error"))
        headers = {}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return Reply(status=status, error_message=message or default[0],
                     error_type=error_type or default[1], headers=headers)

    @staticmethod
    def rate_limit(**kw: Any) -> Reply:
        return Fail.http(429, **kw)

    @staticmethod
    def server_error(**kw: Any) -> Reply:
        return Fail.http(500, **kw)

    @staticmethod
    def bad_request(message: Optional[str] = None) -> Reply:
        return Fail.http(400, message)

    @staticmethod
    def context_overflow() -> Reply:
        return Fail.http(400, "This model's maximum context length is 64000 tokens. However, your messages "
                              "resulted in 99999 tokens. Please reduce the length of the messages.",
                         error_type="invalid_request_error")

    @staticmethod
    def slow(seconds: float = 2.0, reply: Optional[Reply] = None) -> Delay:
        return Delay(seconds, reply)

    @staticmethod
    def empty() -> Reply:
        return Reply(content="", usage=_usage(10, 0))

    @staticmethod
    def null_content() -> Reply:
        return Reply(content=None, usage=_usage(10, 0))

    @staticmethod
    def refusal(text: str = REFUSAL_TEXT) -> Reply:
        return Reply(content=text)

    @staticmethod
    def reasoning_only(reasoning: str = "Thinking about how to summarise: the user edited src/app.py line 42.") -> Reply:
        return Reply(content=None, reasoning_content=reasoning)

    @staticmethod
    def longer_than_input(factor: float = 2.0) -> Callable[[Dict[str, Any]], Reply]:
        def make(req: Dict[str, Any]) -> Reply:
            text = request_text(req) or "x"
            n = int(len(text) * factor) + 1
            body = (text + "\n") * (n // (len(text) + 1) + 1)
            return Reply(content=body[:n])

        make.__name__ = f"longer_than_input_{factor}"
        return make

    @staticmethod
    def drop(after_bytes: int = 40) -> Reply:
        """Send headers and ``after_bytes`` of the body, then close the socket."""
        return Reply(content="this reply is cut off " * 20, drop_after_bytes=after_bytes)


Step = Union[None, Reply, Delay, Callable[[Dict[str, Any]], Reply]]


class FailureSequence:
    """Per-call failure script in front of a base responder.

    ``steps[i]`` decides the i-th call that reaches this object: ``None`` ->
    the base responder; a :class:`Reply` -> sent as is; a :class:`Delay` ->
    the base reply (or its own), late; a callable ``(req) -> Reply``.  After the
    steps run out, calls go to ``base`` (or, with ``cycle=True``, the steps
    repeat).  ``self.calls`` counts calls; ``self.log`` names each step used.
    Put it behind a :class:`Router` to script only the summariser calls.
    """

    def __init__(self, steps: Sequence[Step], base: Optional[Responder] = None, *, cycle: bool = False) -> None:
        self.steps = list(steps)
        self.base = base or SummariserResponder()
        self.cycle = cycle
        self.calls = 0
        self.log: List[str] = []
        self._lock = threading.Lock()

    def __call__(self, req: Dict[str, Any]) -> Reply:
        with self._lock:
            i = self.calls
            self.calls += 1
            if i < len(self.steps):
                step = self.steps[i]
            elif self.cycle and self.steps:
                step = self.steps[i % len(self.steps)]
            else:
                step = None
        if step is None:
            self.log.append("base")
            return self.base(req)
        if isinstance(step, Reply):
            self.log.append(f"reply:{step.status}")
            return step
        if isinstance(step, Delay):
            self.log.append(f"delay:{step.seconds}")
            r = step.reply if step.reply is not None else self.base(req)
            return r.with_(delay=step.seconds)
        self.log.append(getattr(step, "__name__", "callable"))
        return step(req)


# ---------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, dropped stream) is normal here.
        import sys as _sys

        exc = _sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class FakeOpenAI:
    """An OpenAI-compatible server on 127.0.0.1 (free port), in a background thread."""

    def __init__(
        self,
        responder: Optional[Responder] = None,
        *,
        model: str = DEFAULT_MODEL,
        models: Optional[Iterable[str]] = None,
        context_length: int = DEFAULT_CONTEXT_LENGTH,
        host: str = "127.0.0.1",
        port: int = 0,
        fill_usage: bool = True,
    ) -> None:
        self.responder: Responder = responder or ChatResponder()
        self.model = model
        self.models = list(models) if models else [model]
        self.context_length = int(context_length)
        self.fill_usage = fill_usage
        self._host = host
        self._port = port
        self._requests: List[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self.errors: List[str] = []  # responder exceptions (answered as HTTP 500)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> "FakeOpenAI":
        if self._server is not None:
            return self
        handler = _make_handler(self)
        self._server = _Server((self._host, self._port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    close = stop

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- info ----------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def requests(self) -> List[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> List[RecordedRequest]:
        return [r for r in self.requests if r.is_chat]

    @property
    def agent_requests(self) -> List[RecordedRequest]:
        """The agent loop's own model calls: streamed, and not a summariser's call (a newer host
        also streams its compression model's calls, and titles a session with calls of its own)."""
        return [r for r in self.chat_requests if r.body.get("stream") and not looks_like_summary_request(r.body)]

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def set_responder(self, responder: Responder) -> None:
        self.responder = responder

    def _record(self, method: str, path: str, headers: Dict[str, str], raw: bytes) -> RecordedRequest:
        body: Any = None
        if raw:
            try:
                body = json.loads(raw.decode("utf-8"))
            except Exception:
                body = None
        with self._lock:
            rec = RecordedRequest(method, path, headers, body, raw, time.time(), len(self._requests))
            self._requests.append(rec)
        return rec

    def model_entry(self, mid: str) -> Dict[str, Any]:
        return {
            "id": mid,
            "object": "model",
            "created": 1700000000,
            "owned_by": "fake-openai",
            "context_length": self.context_length,
            "max_model_len": self.context_length,
            "context_window": self.context_length,
            "max_context_length": self.context_length,
        }


def _chunk(base: Dict[str, Any], delta: Dict[str, Any], finish: Optional[str] = None) -> Dict[str, Any]:
    d = dict(base)
    d["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    return d


def _split(text: str, n: int) -> List[str]:
    if not text:
        return []
    n = max(1, min(n, len(text)))
    size = -(-len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _make_handler(srv: FakeOpenAI):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "FakeOpenAI/1.0"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

        # -- plumbing ---------------------------------------------------------

        def _read_body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n > 0 else b""

        def _send_json(self, status: int, obj: Any, extra_headers: Optional[Dict[str, str]] = None) -> None:
            data = obj if isinstance(obj, bytes) else (obj.encode() if isinstance(obj, str) else json.dumps(obj).encode())
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra_headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def _drop(self) -> None:
            try:
                self.wfile.flush()
            except Exception:
                pass
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except Exception:
                pass
            self.close_connection = True

        def _norm_path(self) -> str:
            p = self.path.split("?", 1)[0]
            return p.rstrip("/") or "/"

        # -- verbs ------------------------------------------------------------

        def do_GET(self) -> None:  # noqa: N802
            srv._record("GET", self.path, dict(self.headers.items()), b"")
            p = self._norm_path()
            if p in ("/v1/models", "/models"):
                self._send_json(200, {"object": "list", "data": [srv.model_entry(m) for m in srv.models]})
                return
            for prefix in ("/v1/models/", "/models/"):
                if p.startswith(prefix):
                    mid = p[len(prefix):]
                    if mid in srv.models:
                        self._send_json(200, srv.model_entry(mid))
                    else:
                        self._send_json(404, {"error": {"message": f"model {mid} not found", "type": "not_found_error"}})
                    return
            self._send_json(404, {"error": {"message": f"no route GET {p}", "type": "not_found_error"}})

        def do_POST(self) -> None:  # noqa: N802
            raw = self._read_body()
            rec = srv._record("POST", self.path, dict(self.headers.items()), raw)
            p = self._norm_path()
            if p not in ("/v1/chat/completions", "/chat/completions"):
                self._send_json(404, {"error": {"message": f"no route POST {p}", "type": "not_found_error"}})
                return
            req = rec.body if isinstance(rec.body, dict) else None
            if req is None:
                self._send_json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                return
            try:
                reply = srv.responder(req)
                if not isinstance(reply, Reply):
                    raise TypeError(f"responder returned {type(reply).__name__}, not Reply")
            except Exception as exc:  # a broken responder is a test bug: show it, answer 500
                srv.errors.append(f"{type(exc).__name__}: {exc}")
                self._send_json(500, {"error": {"message": f"fake responder failed: {exc}", "type": "server_error"}})
                return
            self._answer(req, reply)

        # -- answering ------------------------------------------------------------

        def _answer(self, req: Dict[str, Any], reply: Reply) -> None:
            if reply.delay > 0:
                time.sleep(reply.delay)
            if reply.status != 200:
                body = {"error": {"message": reply.error_message or f"HTTP {reply.status}",
                                  "type": reply.error_type or "error", "code": reply.status, "param": None}}
                self._send_json(reply.status, body, reply.headers)
                return
            if reply.raw_body is not None:
                self._send_json(200, reply.raw_body, reply.headers)
                return

            model = req.get("model") or srv.model
            cid = "chatcmpl-fake-" + hashlib.sha1(f"{time.time_ns()}-{id(reply)}".encode()).hexdigest()[:16]
            created = int(time.time())
            usage = reply.usage
            if usage is None and srv.fill_usage:
                usage = _usage(prompt_tokens_for(req), _reply_text_tokens(reply))
            finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
            tool_calls = [
                {"id": tc.id or f"call_{i}_{cid[-8:]}", "type": "function",
                 "function": {"name": tc.name, "arguments": tc.arguments_json()}}
                for i, tc in enumerate(reply.tool_calls or [])
            ]

            if req.get("stream"):
                self._answer_stream(req, reply, model, cid, created, usage, finish, tool_calls)
                return

            message: Dict[str, Any] = {"role": "assistant", "content": reply.content}
            if reply.reasoning_content is not None:
                message["reasoning_content"] = reply.reasoning_content
            if tool_calls:
                message["tool_calls"] = tool_calls
            body = {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            }
            if usage is not None:
                body["usage"] = usage
            data = json.dumps(body).encode()
            if reply.drop_after_bytes >= 0:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: min(reply.drop_after_bytes, len(data) - 1)])
                self._drop()
                return
            self._send_json(200, data, reply.headers)

        def _answer_stream(self, req, reply, model, cid, created, usage, finish, tool_calls) -> None:
            base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "system_fingerprint": "fp_fake"}
            events: List[Dict[str, Any]] = [_chunk(base, {"role": "assistant", "content": ""})]
            if reply.reasoning_content:
                for piece in _split(reply.reasoning_content, reply.stream_chunks):
                    events.append(_chunk(base, {"reasoning_content": piece}))
            for piece in _split(reply.content or "", reply.stream_chunks):
                events.append(_chunk(base, {"content": piece}))
            for i, tc in enumerate(tool_calls):
                args = tc["function"]["arguments"]
                half = len(args) // 2
                events.append(_chunk(base, {"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                                                             "function": {"name": tc["function"]["name"], "arguments": args[:half]}}]}))
                events.append(_chunk(base, {"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
            events.append(_chunk(base, {}, finish))
            include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
            if include_usage and usage is not None:
                u = dict(base)
                u["choices"] = []
                u["usage"] = usage
                events.append(u)

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.close_connection = True
            sent = 0
            try:
                for ev in events:
                    data = f"data: {json.dumps(ev)}\n\n".encode()
                    if reply.drop_after_bytes >= 0 and sent + len(data) > reply.drop_after_bytes:
                        cut = max(0, reply.drop_after_bytes - sent)
                        self.wfile.write(data[:cut])
                        self._drop()
                        return
                    self.wfile.write(data)
                    self.wfile.flush()
                    sent += len(data)
                    if reply.chunk_delay > 0:
                        time.sleep(reply.chunk_delay)
                if reply.drop_after_bytes >= 0:
                    self._drop()  # dropped before [DONE]
                    return
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

    return Handler
