"""`python -m minitfm` and the `minitfm` command (see pyproject.toml): the command line.

Ctrl-C and SIGTERM are caught first, before the command line's libraries load, so that one
landing at any moment of the start-up ends it with one `interrupted:` line (see
`run.signals.catch_while_starting`).
"""

from minitfm.run.signals import catch_while_starting


def main() -> None:
    """Console-script entry point: catch the signals, then load and run the CLI."""
    catch_while_starting()
    from minitfm.app.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
