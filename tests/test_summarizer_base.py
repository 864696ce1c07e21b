"""The summariser interface (summarizers/summarize.Summarizer): the built-in extractive
summariser and the model-backed ones implement the same public base class, and the Escalator
runs any of them."""

from __future__ import annotations

from lossless_context.records import Source
from lossless_context.summarizers.summarize import (
    Escalator, ExtractiveSummarizer, ModelSummarizer, OpenAISummarizer, Summarizer, SummarizerError, SummaryRequest)

SOURCES = [Source(f"m{i}", "user", f"Please keep ticket QX-{1000 + i} and path src/app_{i}.py in mind.", None)
           for i in range(40)]


class Shouty(Summarizer):
    name = "shouty"

    def __init__(self) -> None:
        self.levels: list[str] = []

    def summarize(self, req, level, timeout=None):
        self.levels.append(level)
        if level == "normal":
            raise SummarizerError("too quiet")
        return "SUMMARY " + " ".join(s.id for s in req.sources[:3])


def test_builtins_share_the_public_base_class():
    assert issubclass(ExtractiveSummarizer, Summarizer) and issubclass(ModelSummarizer, Summarizer)
    assert issubclass(OpenAISummarizer, Summarizer)


def test_the_escalator_runs_any_summarizer_and_ends_at_the_extractive_one():
    req = SummaryRequest(SOURCES, 120, "leaf")
    s = Shouty()
    res = Escalator(s, None).summarize(req)
    assert s.levels == ["normal", "aggressive"] and res.level == "aggressive" and res.summarizer == "shouty"
    assert res.text.startswith("SUMMARY m0 m1 m2")
    none = Escalator(None, None).summarize(req)
    assert none.level == "deterministic" and none.summarizer == "extractive"
    assert none.text == ExtractiveSummarizer().summarize(req) and "QX-1000" in none.text



def test_sources_seen_again_are_redacted_again_and_alike():
    """The extractive summariser redacts its sources through a memo of texts seen before
    (summarize._redact_builtin): a text met again gives what it gave the first time, secrets
    out; texts that differ (same length, other secret; too long for the memo) are each their own."""
    from lossless_context.summarizers import summarize as sm
    from lossless_context.text.redact import redact_builtin

    key_a, key_b = "sk-" + "A1b2C3d4E5f6G7h8J9k0" * 2, "sk-" + "Z9y8X7w6V5u4T3s2R1q0" * 2
    texts = [f"deploy with OPENAI_API_KEY={key_a} then ship QX-7 now",
             f"deploy with OPENAI_API_KEY={key_b} then ship QX-8 now",
             "log line " * (sm._SOURCE_MEMO_CHARS // 9 + 1) + f"token {key_a}"]
    for _ in range(3):
        for t in texts:
            assert sm._redact_builtin(t) == redact_builtin(t) and key_a not in sm._redact_builtin(t)
    req = SummaryRequest([Source("m1", "user", texts[0], None), Source("m2", "user", texts[1], None)], 60, "leaf")
    first, again = ExtractiveSummarizer().summarize(req), ExtractiveSummarizer().summarize(req)
    assert first == again and key_a not in again and key_b not in again and "QX-7" in again and "QX-8" in again
