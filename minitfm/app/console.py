"""The command line's console: how `minitfm` prints, reads its options and ends a command.

- stdout and stderr (`console`, `err_console`): on a terminal text wraps at word boundaries; piped,
  nothing is wrapped, so lines stay whole;
- help that reads plainly and usage mistakes as one line (`App`, `OneLineErrors`);
- the options several commands share (RUN, --checkpoint, --threads, --json, --force), and those
  a command states in its options class (`option`, from `lab/options.py`);
- options that --over-training leaves unused (the other arguments that need reading are
  `app/arguments.py`'s);
- one line per message (`fail`, `warn`, `note`, `say`), tables (`show`);
- library errors as one line on stderr and their exit code (`clean_errors`): 0 success,
  1 runtime failure, 2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM;
- the prelude of a command that runs a model: its threads claimed (`claimed_threads`), the run
  loaded (`loaded_run`).

The commands themselves are in `app/cli.py`.
"""

from __future__ import annotations

import functools
import inspect
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from minitfm.app.tables import heading_lines, printable
from minitfm.errors import Interrupted, MinitfmError, from_signal, quote, shown_path, spell
from minitfm.lab.options import option_field
from minitfm.run.signals import (
    Terminated,
    signals_held,
    started,
    starting_message,
    stopped_by,
)

if TYPE_CHECKING:
    from minitfm.lab.loaded import Loaded
    from minitfm.run.threads import ThreadClaim

PIPED_WIDTH = 10_000  # piped output has no width to wrap to: this keeps every line whole
MAX_ERROR_CHARS = 500  # one line, however long the user's input was
# How messages name `train`'s options here (see `errors.option`): as this command line's.
CLI_OPTIONS = {"resume": "--resume", "resume_of": "--resume {}", "run_dir": "--run-dir",
               "overwrite": "--overwrite", "again": "minitfm train --resume {}",
               "book": "--book {}", "mode": "--mode", "samples": "--samples",
               "min_len": "--min-len", "max_len": "--max-len"}
RUN_HELP = "Run directory or checkpoint file; default: the most recent run under ./runs."
BOOK_HELP = ("A workbook of minitfm learn: the model runs its functions where written, the "
             "book's elsewhere (a run trained with one runs the book's code unless asked).")
CHECKPOINT_HELP = ("Which checkpoint of the run: best (highest exact match; last.pt while the "
                   "run has none) or last.")
THREADS_HELP = ("CPU threads: auto (the fastest alone, shared with other minitfm processes) "
                "or a fixed count N.")


class Output(Console):
    """stdout: on a terminal, text wraps at word boundaries to its width; piped to a file or a
    program, nothing is wrapped and tables take their natural width, so lines stay whole."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPED_WIDTH, size.height)


console = Output()
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


# --- help and usage ---

def plain_params(params: list) -> None:
    """--help as a reader expects it: a flag without a `<bool>` value beside it, an argument
    whose metavar says it all (`[CONFIG] [KEY=VALUE]...`) without a `<list[str]>`."""
    for param in params:
        if getattr(param, "is_bool_flag", False):
            param.metavar = ""
        elif param.param_type_name == "argument" and param.nargs != 1:
            param.display_type_rich = lambda ctx: None


class PlainHelp:
    """Mixed into Typer's command and group: help text as in `plain_params`, usage as the
    metavars write it (`minitfm train [OPTIONS] [CONFIG] [KEY=VALUE]...`), and the help text
    reflowed to the terminal's width (`reflowed`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = reflowed(self.help)
        if self.short_help is None and self.help:
            self.short_help = self.help.split("\n\n", 1)[0]

    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)  # with --help and Typer's completion options
        plain_params(params)
        return params

    def collect_usage_pieces(self, ctx) -> list[str]:
        arguments = [p for p in self.get_params(ctx) if p.param_type_name == "argument"]
        if not arguments:
            return super().collect_usage_pieces(ctx)
        return [self.options_metavar, *(p.metavar or p.name.upper() for p in arguments)]


def reflowed(help_text: str) -> str:
    """A command's help with each paragraph on one line, for the terminal to wrap to its width
    (the first paragraph is the summary a list of commands shows). In rich markup mode Typer
    keeps a docstring's line breaks, and a paragraph broke mid-sentence wherever the source
    did; a paragraph marked with Click's \\b keeps its lines."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


class Command(PlainHelp, TyperCommand):
    """A minitfm command: see PlainHelp; an option given twice is refused (`once_each`)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        once_each(self, ctx, args)
        return super().parse_args(ctx, args)


class GivenTwice(typer.TyperException):
    """An option given more than once: a usage mistake (exit 2), said in one line."""

    exit_code = 2

    def __init__(self, message: str, ctx) -> None:
        super().__init__(message)
        self.ctx = ctx


def once_each(command, ctx, args: list[str]) -> None:
    """Refuse an option given twice: Click would keep the last one alone, silently (`--threads
    1 --threads 2` ran with 2; `--stack --no-stack` did not stack). Options that take several
    (`--eval-lengths`, `--input`) are not counted. The token after a value option is its value,
    never an option of its own."""
    names = {opt: param for param in command.params if getattr(param, "opts", None)
             and not getattr(param, "multiple", False) and not getattr(param, "count", False)
             for opt in [*param.opts, *getattr(param, "secondary_opts", [])]}
    given: dict[str, list[str]] = {}
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            break
        name, has_value, _ = token.partition("=")
        param = names.get(name)
        if param is None:
            continue
        given.setdefault(param.name, []).append(name)
        if not has_value and not param.is_flag:
            next(tokens, None)  # its value
    for used in given.values():
        if len(set(used)) > 1:  # --stack and --no-stack
            raise GivenTwice(f"{' and '.join(dict.fromkeys(used))} are both given: give one of "
                             f"them (minitfm would keep only the last)", ctx)
        if len(used) > 1:
            raise GivenTwice(f"{used[0]} is given {len(used)} times: give it once (minitfm "
                             f"would keep only the last)", ctx)


class App(typer.Typer):
    """Typer whose commands are `Command`s, so that every command's help reads plainly."""

    def command(self, *args, cls=Command, **kwargs):
        return super().command(*args, cls=cls, **kwargs)


class OneLineErrors(PlainHelp, TyperGroup):
    """Usage mistakes (unknown option, bad value) as one line on stderr with exit 2.

    Typer's usage errors are `typer.TyperException`s (its bundled Click's exceptions derive
    from it since Typer 0.28, hence the floor in pyproject.toml): no private module needed.
    """

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            help_text = ctx.get_help()  # bare `minitfm`: the help, which is no error
            if help_text.strip():
                console.print(help_text, markup=False, highlight=False)
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as err:
            command = " ".join(["minitfm", *subcommands(getattr(err, "ctx", None)), "--help"])
            message = key_for_option(err, sys.argv[1:] if args is None else list(args)) \
                or err.format_message()
            err_console.print(f"error: {printable(message)} (see '{command}')", markup=False)
            code = err.exit_code
        except typer.Abort:  # Click's KeyboardInterrupt before a command took over
            err_console.print(f"interrupted: {starting_message(signal.SIGINT)}", markup=False)
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def subcommands(ctx) -> list[str]:
    """The words after `minitfm` that led to `ctx`'s command: ["learn", "check"]."""
    words = []
    while ctx is not None and ctx.parent is not None:  # the root is minitfm itself
        words.insert(0, ctx.info_name)
        ctx = ctx.parent
    return words


def key_for_option(err: typer.TyperException, args: list[str]) -> str | None:
    """`no option --steps: set it as train.steps=100`: an unknown option of `train` or `sweep`
    (which take KEY=VALUE) named like a config key; None for any other mistake."""
    name, ctx = getattr(err, "option_name", None), getattr(err, "ctx", None)
    if not name or ctx is None or ctx.info_name not in ("train", "sweep"):
        return None
    from minitfm.config import keys_named

    keys = keys_named(name.lstrip("-").replace("-", "_"))
    value = next((arg.partition("=")[2] for arg in args if arg.startswith(f"{name}=")), None)
    if value is None and name in args[:-1]:
        after = args[args.index(name) + 1]
        value = None if after.startswith("--") else after
    if keys == ["seed"] and ctx.info_name == "sweep":  # seed=0..7 is no seed: --seeds reads it
        return f"no option {name}: give the seeds as --seeds {value or '0..7'}"
    shown = " or ".join(f"{key}={value or 'VALUE'}" for key in keys)
    return f"no option {name}: set it as {shown}" if keys else None


# --- options ---

def option(options: type, name: str):
    """The typer.Option of the field `name` of a command's options (`lab/options.py`), where
    its default, bounds and help are stated: plain text, which the help shows as written (its
    `[ray]` escaped, which Rich would read as a style and drop)."""
    spec = option_field(options, name)
    meta, cli = spec.metadata, spec.metadata["cli"]
    return typer.Option(spec.default, *cli.get("flags", ()), min=meta["low"], max=meta["high"],
                        metavar=cli.get("metavar"), help=escape(meta["help"]))


def run_argument():
    """RUN: a run directory or a checkpoint file (see `lab.loaded.load`)."""
    return typer.Argument(None, metavar="[RUN]", help=RUN_HELP)


def checkpoint_option():
    """--checkpoint best|last."""
    return typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP)


def threads_option():
    """--threads auto|N (see `claimed_threads`)."""
    return typer.Option("auto", metavar="auto|N", help=THREADS_HELP)


def book_option():
    """--book DIR: run a learner's workbook (minitfm learn) instead of the run's code."""
    return typer.Option(None, "--book", metavar="DIR", help=BOOK_HELP)


def json_option(help_text: str):
    """--json: what the command prints instead of its tables."""
    return typer.Option(False, "--json", help=help_text)


def force_option(replaced: str, what: str = "picture"):
    """--force: replace the file `replaced` names even if it is not a `what` (picture, page)
    that minitfm wrote (the picture rule, `lab/pictures.py`)."""
    return typer.Option(False, "--force", help=f"Replace {replaced} even if it is not a {what} "
                                                f"minitfm wrote.")


# --- arguments (those that need reading: `app/arguments.py`) ---

# What --over-training leaves unused: their defaults (a value the drawing agrees with, too).
OVER_TRAINING_UNUSED = {"--input": (None,), "--kind": ("all", "cross"), "--head": (None,),
                        "--no-terminal": (True,), "--checkpoint": ("best",),
                        "--threads": ("auto",), "--book": (None,)}


def check_over_training(over_training: bool, given: dict) -> None:
    """--gif needs --over-training, which draws what training recorded: no options of a model."""
    if not over_training:
        raise MinitfmError("--gif needs --over-training (the GIF shows the maps recorded "
                           "during training)")
    unused = [name for name, value in given.items() if value not in OVER_TRAINING_UNUSED[name]]
    if unused:
        raise MinitfmError(f"--over-training cannot be combined with {', '.join(unused)}: it "
                           f"draws the cross-attention recorded during training (it takes RUN, "
                           f"--layer, --out, --gif and --force)")


# --- printing ---

def fail(message: str | list[str], code: int = 2, kind: str = "error"):
    """Print one clean line on stderr (`error: ...`, or `interrupted: ...` when the user
    stopped the command), one per problem given a list of them, and exit with `code`."""
    for text in [message] if isinstance(message, str) else message:
        line = printable(text)
        if len(line) > MAX_ERROR_CHARS:
            line = line[:MAX_ERROR_CHARS - 1] + "…"
        err_console.print(f"{kind}: {line}", markup=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print one `warning: ...` line on stderr; the command goes on."""
    err_console.print(f"warning: {printable(message)}", markup=False)


def note(message: str) -> None:
    """Print one `note: ...` line on stderr."""
    err_console.print(f"note: {printable(message)}", markup=False)


def show(renderable) -> None:
    """Print to stdout; a table's title and caption go on lines of their own, where they wrap
    like any text (at a terminal's width, never when piped), not to the table's width. They
    may hold paths: control characters come out escaped."""
    if not isinstance(renderable, Table):
        console.print(renderable)
        return
    title, caption = renderable.title, renderable.caption
    renderable.title = renderable.caption = None
    for line in heading_lines(printable(str(title or "")), console.width):
        console.print(line, style="table.title", markup=False, highlight=False)
    console.print(renderable)
    if caption:
        console.print(printable(str(caption)), style="table.caption", markup=False,
                      highlight=False)


def say(text: str) -> None:
    """One line on stdout as written (no markup); it may name paths: control characters come
    out escaped."""
    console.print(printable(text), markup=False, highlight=False)


def wrote(path: Path, stream: Console = console, size: int | None = None) -> None:
    """`wrote PATH` on `stream` (`shown_path`: relative inside the current folder, else
    absolute), and `(N kB)` given its `size` in bytes: a path never cut in two, its control and
    format characters escaped."""
    kb = "" if size is None else f" ({size / 1000:,.0f} kB)"
    stream.print(f"wrote {printable(shown_path(path))}{kb}", markup=False, highlight=False,
                 soft_wrap=True)


def widest(renderable) -> int:
    """The cells the widest line of `renderable` takes (of a Columns: of its widest item)."""
    parts = getattr(renderable, "renderables", [renderable])
    unbounded = console.options.update_width(PIPED_WIDTH)  # measures are capped at the width
    return max((console.measure(part, options=unbounded).maximum for part in parts), default=0)


# --- errors ---

def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) \
        or "out of memory" in str(err)


def clean_errors(command=None, *, uses_torch: bool = True):
    """Turn library errors into one line on stderr and their exit code (no traceback).

    A command that `uses_torch` loads it first with signals held (see `signals_held`); sweep
    and runs need no torch in their own process.
    """
    if command is None:
        return functools.partial(clean_errors, uses_torch=uses_torch)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            started()  # from here a Ctrl-C is this command's to handle (below)
            if uses_torch:
                with signals_held():
                    import torch  # noqa: F401
            return command(*args, **kwargs)
        except Interrupted as err:
            fail(str(err.spelled(CLI_OPTIONS)), err.exit_code, "interrupted")
        except MinitfmError as err:
            for line in getattr(err, "__notes__", ()):  # e.g. best.pt fell back to last.pt
                note(line)
            fail(err.spelled(CLI_OPTIONS).problems(), err.exit_code)  # a line per problem
        except KeyboardInterrupt as err:
            if not from_signal(err):  # raised by code, not by a key: say so
                fail("the code raised KeyboardInterrupt (no key was pressed): the command did "
                     "not finish", 1)
            fail(f"{stopped_by(signal.SIGINT)}: the command did not finish", 130, "interrupted")
        except Terminated:
            fail(f"{stopped_by(signal.SIGTERM)}: the command did not finish", 143, "interrupted")
        except BrokenPipeError:  # `minitfm ... | head`: the reader has gone, nothing to say
            silence_stdout()
            raise typer.Exit(1) from None
        except OSError as err:  # stdout on a full disk, a vanished file: no traceback
            silence_stdout()
            where = f" {quote(str(err.filename))}" if err.filename else ""
            fail(f"cannot read or write{where} ({err.strerror or err})", 1)
        except (MemoryError, RuntimeError) as err:
            if not out_of_memory(err):
                raise
            fail("out of memory: lower the sizes (model.d_model, train.batch_size, "
                 "task.max_len, --samples, --batch-size) and try again", 1)

    return wrapper


def silence_stdout() -> None:
    """Nothing more reaches stdout (see `progress.silence`)."""
    from minitfm.app.progress import silence

    silence(sys.stdout)


# --- the prelude of a command that runs a model ---

@contextmanager
def claimed_threads(threads: str) -> Iterator[ThreadClaim]:
    """This process's threads for `--threads` while the block runs: registered with the other
    minitfm processes (see minitfm.run.threads), then given to torch; released at its end."""
    from minitfm.config import parse_threads
    from minitfm.run.threads import ThreadClaim

    try:
        claim = ThreadClaim(parse_threads(threads), warn=warn)
    except ValueError as err:
        raise MinitfmError(f"--{err}") from None
    with claim:
        claim.apply()
        yield claim


def loaded_run(run: Path | None, which: str, book: Path | None = None) -> Loaded:
    """The checkpoint RUN and --checkpoint mean, loaded (`lab.loaded.load`), running the
    workbook --book names if given; a fallback from best.pt to last.pt, and a workbook's run
    loaded with the book's code, are notes on stderr."""
    from minitfm.lab.loaded import load

    loaded = load(run, which, book=book)
    for text in (loaded.note, loaded.code_note):
        if text:
            note(spell(text, CLI_OPTIONS))
    return loaded
