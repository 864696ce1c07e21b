"""Every append-only named schema migration of the PostgreSQL store, in the order it is applied.

Migration NNN is named in :data:`ORDER` below, next to the module that holds its SQL; the modules
are named by what their migrations hold (``schema``: the tables and first functions, 001-019;
``plans``: functions whose plans are kept, 020-031; ``retention``: 032; ``identifiers``: 033 and
035; ``forget``: 034). Never edit, rename or reorder an entry once released: a change is a new
entry at the end (``tests/test_migrations.py`` pins every entry's name and SHA-256, so an edit
of an applied migration fails the suite). A function that a migration created is changed not by
pasting it whole into a new migration but by editing its one current definition in
``functions.py``: :data:`DEFINITIONS` run after the migrations, each again when its revision is
raised (see ``functions.py``).

The runner (``store/migrate.py``, called by ``store/postgres/conn.py``) applies every missing
entry inside one transaction holding ``pg_advisory_xact_lock(MIGRATION_LOCK_KEY)``, so several
processes starting at once migrate exactly once, and records each in ``lcm_migrations``.
Entries named in :data:`OPTIONAL` run inside a savepoint: if one fails (for example the
``pg_trgm`` extension is not installed or the role may not create it) the store works without
it, nothing is recorded, and the next start tries again.
"""

from __future__ import annotations

from types import ModuleType

from . import forget, identifiers, plans, retention, schema
from .forget import ENTRIES as FORGET
from .functions import DEFINITIONS
from .identifiers import ENTRIES as IDENTIFIERS
from .plans import ENTRIES as PLANS
from .retention import ENTRIES as RETENTION
from .schema import ENTRIES as SCHEMA

# A fixed 64-bit key for pg_advisory_xact_lock while migrating ("lcm-migr" in ASCII).
MIGRATION_LOCK_KEY = 0x6C636D2D6D696772

ORDER: list[tuple[str, ModuleType]] = [
    ("001_initial", schema),
    ("002_trigram", schema),
    ("003_message_aliases", schema),
    ("004_presummaries", schema),
    ("005_messages_session_id", schema),
    ("006_message_retractions", schema),
    ("007_session_fork_point", schema),
    ("008_deferred_message_index", schema),
    ("009_summary_costs_history_continuity", schema),
    ("010_context_version_notify", schema),
    ("011_lineage_notify", schema),
    ("012_any_match", schema),
    ("013_message_index_session", schema),
    ("014_parts_from_lexemes", schema),
    ("015_lz4_toast", schema),
    ("016_summaries_cjk", schema),
    ("017_term_counts", schema),
    ("018_summary_chains", schema),
    ("019_message_vectors", schema),
    ("020_cjk_messages", plans),
    ("021_fts_messages_ranked", plans),
    ("022_summary_outline", plans),
    ("023_message_index_cjk_session", plans),
    ("024_fts_under_summary", plans),
    ("025_fts_newest_in_lineage", plans),
    ("026_fts_under_many", plans),
    ("027_term_counts_custom_plans", plans),
    ("028_summary_chains_by_key", plans),
    ("029_fts_summaries_in_lineage", plans),
    ("030_any_match_newest_summaries", plans),
    ("031_term_counts_capped_plans_kept", plans),
    ("032_retention", retention),
    ("033_identifier_lexemes", identifiers),
    ("034_forget_marks", forget),
    ("035_identifier_lexemes_flat", identifiers),
]


def gather(order: list[tuple[str, ModuleType]]) -> list[tuple[str, str]]:
    """The (name, sql) list in `order`; every module's every entry listed exactly once, each
    with the module that holds it (ImportError otherwise: the list cannot be half declared)."""
    held = {name: (module, sql) for module in (schema, plans, retention, identifiers, forget)
            for name, sql in module.ENTRIES}
    names = [name for name, _m in order]
    if sorted(names) != sorted(held) or len(set(names)) != len(names):
        raise ImportError(f"postgres migrations: ORDER and the modules' entries differ: "
                          f"{sorted(set(names) ^ set(held))}")
    for name, module in order:
        if held[name][0] is not module:
            raise ImportError(f"postgres migration {name} is in {held[name][0].__name__}, not {module.__name__}")
    return [(name, held[name][1]) for name in names]


# The list itself is built from the modules' literal entries (so the SQL check can see every
# statement is the package's own text), and must be what ORDER declares (checked at import).
MIGRATIONS: list[tuple[str, str]] = [*SCHEMA, *PLANS, *RETENTION, IDENTIFIERS[0], *FORGET, IDENTIFIERS[1]]
if MIGRATIONS != gather(ORDER):
    raise ImportError("postgres migrations: MIGRATIONS is not the order ORDER declares")

# Migrations the store can live without (run in a savepoint; retried at the next start).
OPTIONAL: frozenset[str] = frozenset({"002_trigram", "015_lz4_toast"})

__all__ = ["DEFINITIONS", "MIGRATION_LOCK_KEY", "MIGRATIONS", "OPTIONAL", "ORDER"]
