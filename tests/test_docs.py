"""The README is checked against the code: its configuration table lists exactly the fields
of LCMConfig, with their real defaults (a key added to one and not the other fails here)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from lossless_context.config import LCMConfig

README = Path(__file__).resolve().parent.parent / "README.md"


def config_rows() -> dict[str, str]:
    """{key: README default} from the table under '## Configuration' (a row may name several
    keys, `a` / `b`, with defaults `x` / `y`)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Configuration"):]
    section = section[:section.index("\n## ", 1)]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        keys = re.findall(r"`([^`]+)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        assert len(keys) == len(defaults), f"README row {line!r}: keys and defaults do not pair up"
        for k, d in zip(keys, defaults):
            assert k not in rows, f"README lists {k!r} twice"
            rows[k] = d
    return rows


def fields() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(LCMConfig) if f.default is not dataclasses.MISSING}


def test_the_readme_configuration_table_lists_every_config_key_and_nothing_else():
    documented, real = set(config_rows()), set(fields())
    assert real - documented == set(), f"config keys missing from the README table: {sorted(real - documented)}"
    assert documented - real == set(), f"README table keys that LCMConfig does not have: {sorted(documented - real)}"


def test_the_readme_defaults_are_the_real_defaults():
    rows = config_rows()
    for name, default in fields().items():
        shown = rows[name]
        if name == "store":  # "" means the path under HERMES_HOME, which the README names
            assert default == "" and "lcm.db" in shown
        elif isinstance(default, bool):
            assert shown == str(default).lower(), (name, shown, default)
        elif isinstance(default, (int, float)):
            assert float(shown) == float(default), (name, shown, default)
        else:
            assert shown.strip('"') == default, (name, shown, default)
