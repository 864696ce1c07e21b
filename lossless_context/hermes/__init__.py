"""The Hermes adapter: everything that exists only because the host is Hermes.

`plugin` (registration, `/lcm` commands, the plugin's entry point), `install` (the three
install routes), `importer` (backfilling Hermes' own session database), `nameclash` (the
bundled plugin that shares our name), `hostlock` (a stale compression lock in the host's database) and `plugin_files/` (the files of a directory install).
It imports the core; the core never imports it.
"""
