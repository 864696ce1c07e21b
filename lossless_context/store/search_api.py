"""The store's search API: the part of the `Store` interface that a grep is built on.

`retrieval/` (lcm_grep's orchestration: candidate fetch, ranking over stored rows, originals
first, the semantic arm) sits above the store and reads it only through :class:`SearchAPI`,
a structural type naming the methods of :class:`~lossless_context.store.base.Store` it may
call, with their types: mypy refuses a retrieval module that calls anything else (a write,
a forget, a pass). Both backends implement every method (the `Store` base gives defaults for
the batched ones); a `GuardedStore` forwards them.

Two rules every backend keeps, whatever the caller asks:

* ``session_ids`` scopes a search to one conversation's lineage (``None``: every session,
  only when the user configured cross-session search); the store applies it in its query,
  so a hit from another lineage never leaves the store;
* a search row is a dict with ``id``, ``session_id``, ``role`` (``"summary"`` for a summary),
  ``created_at`` (a summary's end time), ``text`` and ``rank`` (:data:`SearchRow`); the
  orchestration adds its own keys (``kind``, ``score``, ``traffic``, ``folded``) to it.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ..records import MessageRecord, SummaryRecord
from .base import Store
from ..search.query import QueryPlan
from ..search.regex import BoundedRegex

SearchRow = dict[str, Any]  # id, session_id, role, created_at, text, rank (see the module doc)


class SearchAPI(Protocol):
    """The store methods a grep reads (see `Store` for what each answers)."""

    # -- full-text, substring and regex candidates --------------------------------------------
    def search(self, target: str, session_ids: Sequence[str] | None, plan: QueryPlan, *,
               mode: str = "fts", regex: BoundedRegex | None = None, role: str | None = None,
               since: float | None = None, until: float | None = None, under_summary: int | None = None,
               limit: int = 10, offset: int = 0, order: str = "rank") -> list[SearchRow]: ...

    def search_substrings(self, asks: Sequence[tuple[str, dict[str, Any]]]) -> list[list[SearchRow]]: ...

    def search_under_summaries(self, session_ids: Sequence[str] | None, asks: Sequence[tuple[int, QueryPlan]], *,
                               role: str | None = None, since: float | None = None, until: float | None = None,
                               limit: int = 10) -> list[list[SearchRow]]: ...

    # -- what a ranked search costs, and the rarity of its terms -----------------------------------
    def term_counts(self, target: str, plans: Sequence[QueryPlan], cap: int,
                    newest: int | None = None) -> list[int]: ...

    def term_counts_many(self, asks: Sequence[tuple[str, Sequence[QueryPlan]]], cap: int) -> list[list[int]]: ...

    def any_match(self, target: str, plans: Sequence[QueryPlan], seconds: float) -> list[bool | None]: ...

    def max_row_id(self, target: str) -> int: ...

    # -- the stored rows a ranking reads around its candidates ---------------------------------
    def get_messages(self, ids: Sequence[int]) -> dict[int, MessageRecord]: ...

    def get_summaries(self, ids: Sequence[int], include_staged: bool = False) -> dict[int, SummaryRecord]: ...

    def messages_in(self, spans: Sequence[tuple[str, int, int]]) -> list[MessageRecord]: ...

    def message_summaries_many(self, message_ids: Sequence[int]) -> dict[int, list[int]]: ...

    # -- message vectors (the semantic arm) ------------------------------------------------------
    def put_vectors(self, model: str, rows: Sequence[tuple[int, bytes]]) -> int: ...

    def vectors_after(self, model: str, session_ids: Sequence[str] | None, after: int,
                      limit: int) -> list[tuple[int, int, bytes]]: ...

    def messages_to_embed(self, model: str, after_id: int, limit: int) -> list[tuple[int, str]]: ...


def _a_store_is_a_search_api(store: Store) -> SearchAPI:
    """(never called) mypy checks here that the `Store` interface still offers this API."""
    return store
