"""Sessions and their lineage: which stored sessions are the user's and which are the host's
copies, and what each one may see of its parents.

* `forks` — the host's background forks (memory/skill review agents) told apart from the
            user's real sessions; a fork or a /branch seeded from its parent; the bounds of a
            branch's view of its ancestors (what search and the tools may show).
"""
