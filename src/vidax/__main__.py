"""`python -m vidax ...` runs the CLI (e.g. from a source tree with PYTHONPATH=src)."""

from vidax.cli import main

main()
