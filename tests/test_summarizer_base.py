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

