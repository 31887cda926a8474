"""`minitfm predict`: a trained model decodes your own inputs, one output line per input.

Its arguments need reading (`PredictCommand`, `split_run_and_inputs`): an input may begin with
'-' (`-1+2`), which is no option, since minitfm has no one-letter options; the first word is an
input, not the RUN, when no such path exists (`predict 3 1 4`). Without inputs it reads stdin,
a line each (`stdin_lines`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from minitfm.app.arguments import split_run_and_inputs, stdin_lines
from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import note, warn
from minitfm.app.parameters import (
    book_option,
    checkpoint_option,
    json_option,
    run_argument,
    threads_option,
)
from minitfm.app.text import printable
from minitfm.app.usage import Command
from minitfm.errors import MinitfmError, quote
from minitfm.run.files import to_json


class PredictCommand(Command):
    """`predict`'s arguments: a word that begins with one '-' (`-1+2`, `-3 4`) is an input,
    never an option (minitfm has no one-letter options): Click would refuse it as an unknown
    one."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, inputs_after_options(self, ctx, args))


def inputs_after_options(command, ctx, args: list[str]) -> list[str]:
    """`args` with its options (and their values) first, then `--`, then the rest in order,
    when a word before any `--` begins with one '-'; else `args` as they are."""
    end = args.index("--") if "--" in args else len(args)
    if not any(dashed(arg) for arg in args[:end]):
        return args
    takes_value = {opt for param in command.params if param.param_type_name == "option"
                   and not param.is_flag for opt in param.opts}
    options, rest, tokens = [], [], iter(args[:end])
    for token in tokens:
        if token.startswith("--"):
            options.append(token)
            if token in takes_value:  # `--checkpoint last`: its value, whatever it looks like
                value = next(tokens, None)
                if value is None:
                    raise typer.BadParameter("needs a value", ctx, param_hint=quote(token))
                options.append(value)
        else:
            rest.append(token)
    return [*options, "--", *rest, *args[end + 1:]]


def dashed(arg: str) -> bool:
    """A word that Click would read as one-letter options: '-' and something, not '--'."""
    return arg.startswith("-") and len(arg) > 1 and not arg.startswith("--")


@clean_errors
def predict(
    run: Path | None = run_argument(),
    inputs: list[str] | None = typer.Argument(
        None, metavar="[INPUT]...", help="Inputs in task syntax, e.g. '3 1 4', '314' or "
        "'12+34' (one that begins with '-' is an input too: there are no one-letter options); "
        "none: read one per line from stdin."),
    checkpoint: str = checkpoint_option(),
    as_json: bool = json_option("One JSON object per input, with the expected output and "
                                "whether it matches."),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Decode your own inputs with a trained model, one output line per input.

    Inputs are decoded in order up to the first one that cannot be read: the outputs before
    it are printed, then the error names it (exit 2). Stdin is read as UTF-8, a line ending
    at each newline; blank lines are skipped. Control and format characters of an output are
    printed escaped (\\n, \\u202e); --json writes it exactly."""
    run, inputs = split_run_and_inputs(run, inputs or [])
    if inputs:
        lines, where = list(enumerate(inputs, 1)), "input"
    elif sys.stdin is None or sys.stdin.closed:
        raise MinitfmError("no input: stdin is closed; give INPUT arguments or pipe one input "
                           "per line")
    else:
        lines, where = stdin_lines(), "line"
    with claimed_threads(threads):
        from minitfm.lab.measure.evaluate import predict_lines

        loaded = loaded_run(run, checkpoint, book)
        if not lines:
            raise MinitfmError("no input: give INPUT arguments or pipe one input per line on "
                               "stdin")
        with loaded.running(as_json):
            result = predict_lines(loaded, lines, where)
    if result.warning:
        warn(result.warning)
    for (number, _), row in zip(lines, result.rows):
        if row.get("unknown"):
            note(f"{where} {number}: {', '.join(map(repr, row['unknown']))} never seen in "
                 f"training, read as <unk>")
    for row in result.rows:
        print(to_json(row) if as_json else printable(row["output"]))
    if result.error is not None:
        sys.stdout.flush()  # the outputs before the bad input come first
        raise result.error
