"""`lcm mcp`: the lossless history, read-only, for any MCP client (Claude Code, Codex, Cursor,
Hermes' own MCP client) over the stdio transport.

An outer layer like the CLI: it imports the core, the core never imports it. `scope` holds
what the server may see (a session's lineage, a conversation, every session; by default the
latest session's lineage, fixed when it starts) and says so in words; `server` holds the
store it reads (read-only, behind the store's breaker), the bound on every call, and the MCP
SDK's low-level server (its 1.x and 2.x APIs) around the engine's own tool code
(`tools.dispatch_scoped`). Only `server` imports the `mcp` package (the `[mcp]` extra).
"""

from __future__ import annotations
