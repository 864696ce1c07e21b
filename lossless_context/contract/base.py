"""A stand-in for the host's `agent.context_engine.ContextEngine` when hermes-agent is absent.

Same contract (abstract `name`, `update_from_response`, `should_compress`, `compress`;
the same attributes and default hooks), so the engine works identically with or without
the host installed. When the host is importable, `base_class()` returns the real ABC.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional


class ContextEngine(ABC):
    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0
    last_total_tokens: int = 0
    threshold_tokens: int = 0
    context_length: int = 0
    compression_count: int = 0
    threshold_percent: float = 0.75
    protect_first_n: int = 3
    protect_last_n: int = 6

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def update_from_response(self, usage: Dict[str, Any]) -> None: ...

    @abstractmethod
    def should_compress(self, prompt_tokens: Optional[int] = None) -> bool: ...

    @abstractmethod
    def compress(self, messages: List[Dict[str, Any]], current_tokens: Optional[int] = None,
                 focus_topic: Optional[str] = None, force: bool = False,
                 memory_context: str = "") -> List[Dict[str, Any]]: ...

    def should_compress_preflight(self, messages: List[Dict[str, Any]]) -> bool:
        return False

    def has_content_to_compress(self, messages: List[Dict[str, Any]]) -> bool:
        return True

    def on_session_start(self, session_id: str, **kwargs: Any) -> None:
        return None

    def on_session_end(self, session_id: str, messages: List[Dict[str, Any]]) -> None:
        return None

    def on_session_reset(self) -> None:
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0
        self.last_total_tokens = 0
        self.compression_count = 0

    def get_tool_schemas(self) -> List[Dict[str, Any]]:
        return []

    def handle_tool_call(self, name: str, args: Dict[str, Any], **kwargs: Any) -> str:
        return json.dumps({"error": f"Unknown context engine tool: {name}"})

    def get_status(self) -> Dict[str, Any]:
        last = self.last_prompt_tokens if self.last_prompt_tokens > 0 else 0
        return {
            "last_prompt_tokens": last,
            "threshold_tokens": self.threshold_tokens,
            "context_length": self.context_length,
            "usage_percent": min(100, last / self.context_length * 100) if self.context_length else 0,
            "compression_count": self.compression_count,
        }

    def update_model(self, model: str, context_length: int, base_url: str = "", api_key: str = "",
                     provider: str = "", api_mode: str = "", **kwargs: Any) -> None:
        self.context_length = context_length
        self.threshold_tokens = int(context_length * self.threshold_percent)


def base_class() -> type:
    """The host's ContextEngine when Hermes is installed (so the host's isinstance checks hold),
    else the stand-in above with the same contract."""
    from ..hostapi import context_engine_class

    return context_engine_class() or ContextEngine
