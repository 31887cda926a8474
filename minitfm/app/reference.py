"""`python -m minitfm.app.reference TRAINER [KEY=VALUE ...]`: one plain reference trainer
(`lab/measure/reference.py`) trained in a process of its own, as `minitfm bench --solve` runs
it, its report printed as one JSON line: trainer, seed, steps_to_target, steps, exact_match.

A process of its own, not a command of `minitfm`: the bench times each trainer's whole process,
from its start to its exit, and this one loads only what the trainer needs (the command line's
Typer and rich would add their start-up to the reference's time). Errors are one line on stderr
with the exit codes of the command line: 2 for bad input.
"""

from __future__ import annotations

import sys

from minitfm.errors import MinitfmError
from minitfm.lab.measure.reference import TRAINERS, run
from minitfm.run.files import to_json


def main(argv: list[str]) -> int:
    """Train the reference TRAINER of `argv` with its KEY=VALUE overrides; one JSON line on
    stdout, the exit code returned."""
    if not argv:
        sys.stderr.write(f"usage: python -m minitfm.app.reference {{{','.join(TRAINERS)}}} "
                         f"[KEY=VALUE ...]\n")
        return 2
    try:
        result = run(argv[0], argv[1:])
    except MinitfmError as error:
        sys.stderr.write("".join(f"error: {problem}\n" for problem in error.problems()))
        return error.exit_code
    sys.stdout.write(to_json(result) + "\n")  # this process's only output, for the bench
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
