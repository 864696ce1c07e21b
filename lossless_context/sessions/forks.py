"""The host's background forks (memory/skill review agents) and the user's real sessions.

Hermes runs a background review every few turns on a forked agent, which gets its own
deep copy of our engine and a session of its own. Such a fork is recognised two ways:

* R19: the copy is bound (``bind_session_state``) *without* the host's session database
  while another copy of the same registered engine was bound *with* it — the review fork
  is built with persistence disabled;
* newer hosts: the list it hands us ends with the host's own review instruction
  ("Review the conversation above …") as a user message; 0.22 also detaches the fork's
  engine with ``bind_session_state(session_db=None, session_id="")``.

A recognised fork's session is linked to the user's live session (``parent_id``) and
marked ``boundary_reason = "background"``; it is never the live session the slash
commands act on, never the CLI's default "latest session", and stores nothing of the
parent's conversation again: it starts from the parent's active context (`seed_fork`), so
the copied messages and our summary block align with the parent's rows and summaries. The
host's review instruction is stored as the host's (role ``system``), never as user speech.
A fork's passes stay in its own session, published there when made (no commit ever comes for a
fork: contract/lifecycle.py); nothing is ever published into the parent.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..messages import flatten_content, role_of

BACKGROUND = "background"  # the boundary_reason of a fork's session
REVIEW_PREFIXES = ("Review the conversation above",)
HOST_INSTRUCTION = "_lcm_host_instruction"  # marks the host's review prompt: stored as its, never user speech
HOST_ROLE = "system"  # the stored role of such a prompt (the row's raw message keeps the host's own)


def as_host_instruction(messages: Sequence[Any]) -> list[Any]:
    """A fork's list with the host's review prompt marked (a copy with HOST_INSTRUCTION set), so
    it is stored as the host's instruction (role HOST_ROLE), not as something the user said."""
    return [dict(m, **{HOST_INSTRUCTION: True}) if is_review_prompt(m) else m for m in messages]


def seed_fork(store: Any, session_id: str, parent_id: str | None) -> bool:
    """A background fork's session starts from the parent's active context: the conversation it
    copied aligns with the parent's rows (our block with the parent's summaries), so only what
    the fork adds is stored. False when the session already has a history of its own."""
    if not parent_id or parent_id == session_id:
        return False
    _v, own = store.get_context(session_id)
    if own or store.session_message_ids(session_id):
        return False
    store.set_fork_point(session_id)
    _v, ctx = store.get_context(parent_id)
    if ctx:
        store.set_context(session_id, ctx)
    return True


def is_review_prompt(msg: Any) -> bool:
    """The host's own review instruction (a user message it writes, not the user)."""
    if not isinstance(msg, dict) or role_of(msg) != "user":
        return False
    text = flatten_content(msg.get("content")).lstrip()
    return text.startswith(REVIEW_PREFIXES)


def is_review_list(messages: Sequence[Any]) -> bool:
    """True when the last user message of `messages` is the host's review instruction."""
    for m in reversed(messages):
        if isinstance(m, dict) and role_of(m) == "user":
            return is_review_prompt(m)
    return False


def is_background(session: dict[str, Any] | None) -> bool:
    return session is not None and session.get("boundary_reason") == BACKGROUND


def latest_real_session(sessions: Sequence[dict[str, Any]]) -> str | None:
    """The user's most recent real session: not a background fork, and with stored messages
    (an empty one — an agent that never got to talk — only when nothing else exists)."""
    def key(s: dict[str, Any]) -> tuple:
        return (s.get("updated_at") or 0, s.get("created_at") or 0, s["id"])

    real = [s for s in sessions if not is_background(s)]
    with_messages = [s for s in real if (s.get("messages") or 0) > 0]
    pool = with_messages or real or list(sessions)
    return max(pool, key=key)["id"] if pool else None


BRANCH = "branch"  # the boundary_reason of a host /branch copy


def seed_branch(store: Any, session_id: str, parent_id: str,
                store_parent: Callable[[list[Any]], Any] | None = None,
                host_copy: Callable[[], list[Any]] | None = None) -> bool:
    """A new host branch of `parent_id`: it starts from the parent's active context (so the
    copied history aligns with the parent's rows and is not stored again) and sees the
    parent's history only up to now (its fork point). False when `session_id` already has
    a history of its own (a resumed session, a rotation child): nothing is changed then.

    `host_copy` reads the history the host copied into the branch (only when seeding: a
    resumed session or a rotation child never pays for reading its whole record). Below the compression
    threshold the host never handed the parent's latest turns to the engine, so they are
    stored into the parent first (`store_parent`), before the fork point is taken: else the
    branch would store them again as its own, and the parent's copy would count as written
    after the fork."""
    _v, own = store.get_context(session_id)
    if own or store.session_message_ids(session_id):
        return False
    copied = host_copy() if host_copy is not None and store_parent is not None else []
    if copied and store_parent is not None:
        store_parent(copied)
    store.ensure_session(session_id, parent_id=parent_id, boundary_reason=BRANCH)
    store.set_fork_point(session_id)
    _v, ctx = store.get_context(parent_id)
    if ctx:
        store.set_context(session_id, ctx)
    return True


def lineage_bounds(store: Any, session_id: str) -> dict[str, tuple[int, int]]:
    """Ancestors of `session_id` seen through a fork point: session → (newest message id,
    newest summary id) visible. Sessions not listed are seen whole."""
    out: dict[str, tuple[int, int]] = {}
    bound: tuple[int, int] | None = None
    for _sid, parent, fp in store.ancestry(session_id):
        if fp is not None:
            bound = fp if bound is None else (min(bound[0], fp[0]), min(bound[1], fp[1]))
        if parent and bound is not None:
            out[parent] = bound
    return out
