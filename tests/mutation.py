"""The mutation harness: break named parts of the product, check that the tests go red.

    python -m tests.mutation                 # every mutant (21 min measured on a busy 2-core machine)
    python -m tests.mutation tools-raise     # one or more by name
    python -m tests.mutation --list          # the mutants and the tests that must catch them

For each mutant (tests/support/mutants.py) it first runs the catching tests unmutated — they must
pass, or a red run would prove nothing — then again with `LCM_MUTANT=<name>`, which breaks that
part in the test process; at least one catching test must fail (the harness wants all of them to,
and the table says which did). It prints a Markdown table and exits non-zero when a mutant
survives or a catcher fails without one.

CI does not run it (it would about double the suite's time); run it before every release and
whenever a catching test or a mutated part changes (see the README's Development section).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.support.mutants import ENV, MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(FAILED|ERROR) (\S+)")


def run(targets: tuple[str, ...], mutant: str | None) -> tuple[int, set[str], float]:
    """(exit code, the node ids that failed or errored, seconds) of one pytest run."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if mutant:
        env[ENV] = mutant
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=no", "-rfE",
                        "-o", "addopts=", *targets], cwd=ROOT, env=env, capture_output=True, text=True)
    red = {m.group(2) for line in p.stdout.splitlines() if (m := LINE.match(line))}
    return p.returncode, red, time.monotonic() - t0


def check(m: Mutant) -> tuple[bool, str]:
    code, red, t_clean = run(m.catchers, None)
    if code != 0:
        return False, f"| {m.name} | {m.what} | catchers fail WITHOUT the mutant: {', '.join(sorted(red)) or code} | | |"
    code, red, t_mut = run(m.catchers, m.name)
    caught = sorted(red)
    missed = [c for c in m.catchers if not any(r == c or r.startswith(c) for r in red)]
    ok = code != 0 and bool(caught)
    verdict = "caught" if ok else "SURVIVED"
    shown = caught[:4] + ([f"… {len(caught) - 4} more"] if len(caught) > 4 else [])
    return ok, (f"| {m.name} | {m.what} | {verdict} by {len(caught)}: {'<br>'.join(shown) or '-'} | "
                f"{'<br>'.join(missed) or '-'} | {t_clean + t_mut:.0f} s |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their catching tests")
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTANTS.values():
            print(f"{m.name}: {m.what}")
            for c in m.catchers:
                print(f"    {c}")
        return 0
    unknown = [n for n in args.names if n not in MUTANTS]
    if unknown:
        print(f"unknown mutant(s): {', '.join(unknown)}; known: {', '.join(MUTANTS)}", file=sys.stderr)
        return 2
    chosen = [MUTANTS[n] for n in args.names] or list(MUTANTS.values())
    print("| mutant | what is broken | result: tests that went red | catchers that stayed green | time |")
    print("|---|---|---|---|---|")
    failed = 0
    for m in chosen:
        ok, row = check(m)
        print(row, flush=True)
        failed += not ok
    if failed:
        print(f"\n{failed} mutant(s) not caught (or catchers red without them)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
