"""`python -m minitfm` runs the CLI."""

from minitfm.cli import main

main()
