"""Plain records passed between the engine, the store backends and the tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NewMessage:
    """A message about to be stored verbatim."""

    raw: dict[str, Any] | Any
    role: str
    ident: str
    uid: str | None
    text: str
    tokens: int
    created_at: float
    supersedes: int | None = None
    absorbed: list[str] = field(default_factory=list)
    large: bool = False
    exploration: str | None = None


@dataclass
class MessageRecord:
    id: int
    session_id: str
    seq: int
    uid: str | None
    ident: str
    role: str
    raw: Any
    text: str
    tokens: int
    created_at: float
    large: bool = False
    exploration: str | None = None


@dataclass
class NewSummary:
    """A summary node to stage; children are message ids (leaf) or summary ids (condensed)."""

    key: str  # caller's temporary key, resolved to a real id by the store
    kind: str  # "leaf" | "condensed"
    depth: int
    text: str
    tokens: int
    source_tokens: int
    level: str  # "normal" | "aggressive" | "deterministic" | "exploration"
    summarizer: str
    t_start: float | None
    t_end: float | None
    n_messages: int
    message_ids: list[int] = field(default_factory=list)
    child_keys: list[str | int] = field(default_factory=list)  # int = existing id, str = key


@dataclass
class SummaryRecord:
    id: int
    session_id: str
    kind: str
    depth: int
    text: str
    tokens: int
    source_tokens: int
    level: str
    summarizer: str
    t_start: float | None
    t_end: float | None
    n_messages: int
    state: str
    pass_id: str | None
    created_at: float


@dataclass(slots=True)  # (one per context item: no per-instance dict)
class ContextEntry:
    """One element of a session's active context: a raw message or a summary node."""

    kind: str  # "m" | "s"
    ref: int
    ident: str = ""
    role: str = ""
    tokens: int = 0


@dataclass
class StagedPass:
    pass_id: str
    session_id: str
    base_version: int
    base_len: int
    items: list[tuple[str, int]]
    top_nodes: list[int]
    created_at: float


@dataclass(frozen=True, slots=True)
class Source:
    """One message or summary to be summarised, already flattened to plain text."""

    id: str  # "m123" for a message, "s7" for a summary
    role: str  # user | assistant | tool | system | summary
    text: str
    timestamp: str | None = None
