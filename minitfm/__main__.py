"""`python -m minitfm` runs the CLI."""

from minitfm.app.cli import main

main()
