"""Re-summarise one summary node with the current summariser (`lcm resummarize ID`).

The node keeps its id, span and place in the DAG; only its text (and level, summariser,
tokens, cost) change, and the previous text is kept in the node's history. A leaf is
summarised from what the model was shown of its messages (stubs and exploration
summaries where they stand), a condensed node from its children's texts.
"""

from __future__ import annotations

from typing import Any

from ..pipeline.assemble import Slot
from ..pipeline.compaction import source_text
from ..records import Source
from ..summarizers.summarize import Escalator, SummaryRequest
from ..tokens import estimate_text_tokens


def resummarize(store: Any, esc: Escalator, summary_id: int, target_tokens: int) -> dict[str, Any]:
    """Re-summarise node `summary_id`; returns what changed (raises LookupError if unknown)."""
    rec = store.get_summaries([summary_id]).get(summary_id)
    if rec is None:
        raise LookupError(f"no summary s{summary_id}")
    kids, mids = store.summary_children(summary_id)
    sources: list[Source] = []
    if mids:
        records = store.get_messages(mids)
        for mid in mids:
            r = records.get(mid)
            if r is None:
                continue
            text = source_text(Slot("m", [mid], None, r.role, r.tokens), records)
            if text is not None:
                sources.append(Source(f"m{mid}", r.role, text, None))
    if kids:
        for k, child in sorted(store.get_summaries(kids).items()):
            sources.append(Source(f"s{k}", "summary", child.text, None))
    src_tokens = sum(estimate_text_tokens(s.text) for s in sources)
    target = min(target_tokens, max(32, src_tokens // 2))
    res = esc.summarize(SummaryRequest(sources, target, "condensed" if kids else "leaf"))
    tokens = estimate_text_tokens(res.text)
    store.replace_summary(summary_id, res.text, tokens, res.level, res.summarizer)
    sp = res.spend
    if sp.calls:
        store.put_summary_costs([(summary_id, sp.model, sp.calls, sp.input_tokens, sp.output_tokens,
                                  round(sp.seconds * 1000, 1))])
    return {"id": f"s{summary_id}", "level": res.level, "summarizer": res.summarizer, "tokens": tokens,
            "previous_tokens": rec.tokens, "previous_level": rec.level, "spend": sp.as_dict(),
            "history": len(store.summary_history(summary_id))}
