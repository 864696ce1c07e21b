"""`python -m lossless_context.cli`: the `lcm` command."""

from . import main

main()
