"""The `lcm` command line: `commands` (the click group and its commands), `render` (how results
print), `session_cmds` (`lcm context`, `lcm forget`), `lifecycle_cmds` (`lcm prune`, `lcm vacuum`),
`cipher_cmds` (`lcm encrypt`, `rekey`, `decrypt`) and `mcp_cmd` (`lcm mcp`, serving the history
to MCP clients through `mcp_server/`). Only this package knows click and rich.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """The `lcm` console script (imports click and the commands only when run)."""
    from .commands import main as run

    run(argv)
