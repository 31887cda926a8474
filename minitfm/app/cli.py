"""The `minitfm` command line: thin commands over the library.

This is the only module that prints errors and picks exit codes: 0 success, 1 runtime
failure, 2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

import typer
from rich.console import Console, ConsoleDimensions
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from minitfm import __version__
from minitfm.app.tables import (
    ablation_tables,
    attention_text,
    bench_tables,
    heading_lines,
    over_training_table,
    per_length_table,
    printable,
    runs_table,
    sweep_table,
    tasks_table,
)
from minitfm.errors import Interrupted, MinitfmError, quote
from minitfm.lab.options import (
    MAX_SAMPLES,
    AblateOptions,
    EvalOptions,
    VisualizeOptions,
    option_field,
)
from minitfm.run.signals import signals_held, started, starting_message, stopped_by

PIPED_WIDTH = 10_000  # piped output has no width to wrap to: this keeps every line whole
# How messages name `train`'s options here (see `errors.option`): as this command line's.
CLI_OPTIONS = {"resume": "--resume", "resume_of": "--resume {}", "run_dir": "--run-dir",
               "overwrite": "--overwrite", "again": "minitfm train --resume {}"}


class Output(Console):
    """stdout: on a terminal, text wraps at word boundaries to its width; piped to a file or a
    program, nothing is wrapped and tables take their natural width, so lines stay whole."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPED_WIDTH, size.height)


console = Output()
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


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
    metavars write it (`minitfm train [OPTIONS] [CONFIG] [KEY=VALUE]...`)."""

    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)  # with --help and Typer's completion options
        plain_params(params)
        return params

    def collect_usage_pieces(self, ctx) -> list[str]:
        arguments = [p for p in self.get_params(ctx) if p.param_type_name == "argument"]
        if not arguments:
            return super().collect_usage_pieces(ctx)
        return [self.options_metavar, *(p.metavar or p.name.upper() for p in arguments)]


class Command(PlainHelp, TyperCommand):
    """A minitfm command: see PlainHelp."""


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
            command = f"minitfm {err.ctx.info_name} --help" if getattr(err, "ctx", None) \
                and err.ctx.parent else "minitfm --help"
            err_console.print(f"error: {printable(err.format_message())} (see '{command}')",
                              markup=False)
            code = err.exit_code
        except typer.Abort:  # Click's KeyboardInterrupt before a command took over
            err_console.print(f"interrupted: {starting_message(signal.SIGINT)}", markup=False)
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = App(
    cls=OneLineErrors,
    name="minitfm",
    help="A toy encoder-decoder transformer trainer: hand-written attention, synthetic tasks, "
         "attention maps you can see.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

RUN_HELP = "Run directory or checkpoint file; default: the most recent run under ./runs."
CHECKPOINT_HELP = ("Which checkpoint of the run: best (highest exact match; last.pt while the "
                   "run has none) or last.")
THREADS_HELP = ("CPU threads: auto (the fastest alone, shared with other minitfm processes) "
                "or a fixed count N.")


def option(options: type, name: str):
    """The typer.Option of the field `name` of a command's options (`lab/options.py`), where
    its default, bounds and help are stated."""
    spec = option_field(options, name)
    meta, cli = spec.metadata, spec.metadata["cli"]
    return typer.Option(spec.default, *cli.get("flags", ()), min=meta["low"], max=meta["high"],
                        metavar=cli.get("metavar"), help=meta["help"])


MAX_ERROR_CHARS = 500  # one line, however long the user's input was


def fail(message: str, code: int = 2, kind: str = "error"):
    """Print one clean line on stderr (`error: ...`, or `interrupted: ...` when the user
    stopped the command) and exit with `code`."""
    line = printable(message)
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 1] + "…"
    err_console.print(f"{kind}: {line}", markup=False)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print one `warning: ...` line on stderr; the command goes on."""
    err_console.print(f"warning: {printable(message)}", markup=False)


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


def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) \
        or "out of memory" in str(err)


def loaded_run(run: Path | None, which: str):
    """The checkpoint RUN and --checkpoint mean, loaded (`lab.loaded.load`); a fallback from
    best.pt to last.pt is a note on stderr."""
    from minitfm.lab.loaded import load

    loaded = load(run, which)
    if loaded.note:
        note(loaded.note)
    return loaded


def note(message: str) -> None:
    """Print one `note: ...` line on stderr."""
    err_console.print(f"note: {printable(message)}", markup=False)


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
            fail(str(err.spelled(CLI_OPTIONS)), err.exit_code)
        except KeyboardInterrupt:
            fail(f"{stopped_by(signal.SIGINT)}: the command did not finish", 130, "interrupted")
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
    from minitfm.app.progress import silence

    silence(sys.stdout)


def version_callback(value: bool) -> None:
    if value:
        console.print(f"minitfm {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """minitfm: train, measure and look inside a small transformer on synthetic tasks."""
    from minitfm.run.memory import keep_freed_memory

    keep_freed_memory()  # reuse freed activations instead of page-faulting them in every step


@app.command("train")
@clean_errors
def train_command(
    args: list[str] | None = typer.Argument(
        None, metavar="[CONFIG] [KEY=VALUE]...",
        help="A YAML config (default: the built-in reverse task) then overrides such as "
             "model.d_model=128 train.steps=500."),
    resume: Path | None = typer.Option(
        None, "--resume", metavar="RUN",
        help="Continue this run (directory or checkpoint) from its last checkpoint; "
             "KEY=VALUE may change train.* and log.* keys."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Write the run here "
                                           "instead of log.dir/<name>-<timestamp>; with "
                                           "--resume, only for a .pt outside any run."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Allow --run-dir to be an "
                                   "existing minitfm run directory (its files are replaced)."),
    print_config: bool = typer.Option(False, "--print-config",
                                      help="Print the resolved config as YAML and exit."),
) -> None:
    """Train a model on a synthetic task; Ctrl-C saves a checkpoint you can --resume."""
    from minitfm.config import load_config, to_yaml

    config_path, overrides = split_config_args(args or [], allow_config=resume is None)
    if resume is not None:
        from minitfm.run.rundir import resolve_checkpoint
        ckpt = resolve_checkpoint(resume, "last")
        if print_config:
            from minitfm.run.checkpoint import load_checkpoint
            from minitfm.run.resume import resume_config
            resumed = resume_config(load_checkpoint(ckpt), overrides, ckpt).cfg
            console.print(to_yaml(resumed), end="", markup=False, highlight=False, soft_wrap=True)
            return
        return train_on_console(None, resume=ckpt, overrides=overrides, run_dir=run_dir,
                                overwrite=overwrite)
    cfg = load_config(config_path, overrides)
    if print_config:
        from minitfm.run.limits import check_fits, training_parts
        check_fits(training_parts(cfg), "training")  # it refuses what train refuses
        console.print(to_yaml(cfg), end="", markup=False, highlight=False,
                      soft_wrap=True)  # a long path stays on its line: the output is YAML
        return
    train_on_console(cfg, run_dir=run_dir, overwrite=overwrite)


def split_config_args(args: list[str], allow_config: bool) -> tuple[str | None, list[str]]:
    """`[CONFIG] [KEY=VALUE]...` -> (config path or None, overrides).

    The first argument is the config when it has no `=`, names a file or ends in .yaml/.yml
    (a folder such as `sweep/lr=0.001/config.yaml` may hold one)."""
    first = args[0] if args else ""
    if args and ("=" not in first or is_file(first) or first.endswith((".yaml", ".yml"))):
        if not allow_config:
            raise MinitfmError(f"{quote(first)}: with --resume the config comes from the run; "
                               f"give only KEY=VALUE overrides")
        return args[0], args[1:]
    return None, args


def is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except OSError:  # a name too long to be a path is no file
        return False


def train_on_console(cfg, **options) -> None:
    """`minitfm train`'s run (`options` are those of `run.session.RunOptions`), its progress on
    the console."""
    from minitfm.run.threads import ThreadClaim

    # Registered before torch loads, so that other minitfm processes see this one at once;
    # a resumed run's `threads` is known once its checkpoint is read (train updates it).
    with ThreadClaim(cfg.threads if cfg is not None else "auto", warn=warn) as claim:
        from minitfm.app.api import train_run
        from minitfm.app.progress import ConsoleReporter

        reporter = ConsoleReporter(console, err_console)
        try:
            train_run(cfg, reporter, threads=claim, **options)
        except MinitfmError as err:
            if getattr(err, "silent", False):  # under torchrun rank 0 prints every rank's error
                raise typer.Exit(err.exit_code) from None
            raise
        finally:
            reporter.stop()


def claim_threads(value: str):
    """This process's thread registration for `--threads` (see minitfm.run.threads)."""
    from minitfm.config import parse_threads
    from minitfm.run.threads import ThreadClaim

    try:
        return ThreadClaim(parse_threads(value), warn=warn)
    except ValueError as err:
        raise MinitfmError(f"--{err}") from None


@app.command("eval")
@clean_errors
def eval_command(
    run: Path | None = typer.Argument(None, metavar="[RUN]", help=RUN_HELP),
    checkpoint: str = typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP),
    samples: int = option(EvalOptions, "samples"),
    min_len: int | None = option(EvalOptions, "min_len"),
    max_len: int | None = option(EvalOptions, "max_len"),
    seed: int | None = option(EvalOptions, "seed"),
    batch_size: int = option(EvalOptions, "batch_size"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of "
                                 "tables."),
    plot: Path | None = typer.Option(None, "--plot", metavar="FILE", help="Also draw exact "
                                     "match per length as a PNG bar chart (trained lengths and "
                                     "beyond in two colours)."),
    force: bool = typer.Option(False, "--force", help="Replace the --plot file even if it is "
                               "not a picture minitfm wrote."),
    threads: str = typer.Option("auto", metavar="auto|N", help=THREADS_HELP),
) -> None:
    """Measure a trained run honestly: greedy decoding on held-out data, per-length table."""
    if plot is not None:
        from minitfm.lab.plots import check_output

        check_output(plot, "--plot", force)  # before the decoding, not after
    options = EvalOptions(samples, min_len, max_len, seed, batch_size)
    with claim_threads(threads) as claim:
        from minitfm.lab.evaluate import eval_report

        claim.apply()
        report = eval_report(loaded_run(run, checkpoint), options)
    if as_json:
        print(json.dumps(report))
    else:
        show(per_length_table(report))
    if plot is not None:
        from minitfm.lab.plots import length_chart

        length_chart(report, plot, force)
        # beside --json's one object, on stderr: stdout stays one JSON document
        (err_console if as_json else console).print(f"wrote {printable(str(plot))}", markup=False,
                                                    highlight=False, soft_wrap=True)


@app.command()
@clean_errors
def predict(
    run: Path | None = typer.Argument(None, metavar="[RUN]", help=RUN_HELP),
    inputs: list[str] | None = typer.Argument(
        None, metavar="[INPUT]...", help="Inputs in task syntax, e.g. '3 1 4', '314' or "
        "'12+34'; none: read one per line from stdin."),
    checkpoint: str = typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per input, with the "
                                 "expected output and whether it matches."),
    threads: str = typer.Option("auto", metavar="auto|N", help=THREADS_HELP),
) -> None:
    """Decode your own inputs with a trained model, one output line per input.

    Inputs are decoded in order up to the first one that cannot be read: the outputs before
    it are printed, then the error names it (exit 2). Blank stdin lines are skipped."""
    run, inputs = split_run_and_inputs(run, inputs or [])
    if inputs:
        lines, where = list(enumerate(inputs, 1)), "input"
    elif sys.stdin is None or sys.stdin.closed:
        raise MinitfmError("no input: stdin is closed; give INPUT arguments or pipe one input "
                           "per line")
    else:
        lines = [(n, text) for n, text in enumerate(sys.stdin.read().splitlines(), 1)
                 if text.strip()]
        where = "line"
    with claim_threads(threads) as claim:
        from minitfm.lab.evaluate import predict_lines

        claim.apply()
        loaded = loaded_run(run, checkpoint)
        if not lines:
            raise MinitfmError("no input: give INPUT arguments or pipe one input per line on "
                               "stdin")
        result = predict_lines(loaded, lines, where)
    if result.warning:
        err_console.print(f"warning: {printable(result.warning)}", markup=False)
    for (number, _), row in zip(lines, result.rows):
        if row.get("unknown"):
            err_console.print(f"note: {where} {number}: {', '.join(map(repr, row['unknown']))} "
                              f"never seen in training, read as <unk>", markup=False)
    for row in result.rows:
        print(json.dumps(row) if as_json else row["output"])
    if result.error is not None:
        sys.stdout.flush()  # the outputs before the bad input come first
        raise result.error


def split_run_and_inputs(run: Path | None, inputs: list[str]) -> tuple[Path | None, list[str]]:
    """`predict 3 1 4` has no RUN: a first word that is no existing path is an input, unless
    it looks like a path (holds a '/' or ends in .pt): then it is a mistyped RUN."""
    if run is not None and not run.exists():
        if "/" in str(run) or run.suffix == ".pt":
            raise MinitfmError(f"run {quote(str(run))} not found: give a run directory or a "
                               f".pt file")
        return None, [str(run), *inputs]
    return run, inputs


@app.command("visualize-attention")
@clean_errors
def visualize_attention(
    run: Path | None = typer.Argument(None, metavar="[RUN]", help=RUN_HELP),
    input_text: str | None = option(VisualizeOptions, "input_text"),
    kind: str = option(VisualizeOptions, "kind"),
    layer: int | None = option(VisualizeOptions, "layer"),
    head: int | None = option(VisualizeOptions, "head"),
    out: Path | None = option(VisualizeOptions, "out"),
    over_training: bool = typer.Option(
        False, "--over-training", help="Draw the cross-attention recorded at each evaluation "
        "of training (the run's attention.jsonl) as one PNG strip: a column per step, a row "
        "per head of the best aligned layer (or --layer); takes RUN, --layer, --out, --gif, "
        "--force."),
    gif: Path | None = typer.Option(None, metavar="FILE", help="With --over-training, also an "
                                    "animated GIF: a frame per recorded step."),
    force: bool = option(VisualizeOptions, "force"),
    terminal: bool = typer.Option(True, "--terminal/--no-terminal",
                                  help="Also draw the heatmaps in the terminal; a bare --kind "
                                       "all draws only cross-attention there (the PNG has "
                                       "all kinds)."),
    checkpoint: str = typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP),
    threads: str = typer.Option("auto", metavar="auto|N", help=THREADS_HELP),
) -> None:
    """Show what every attention head does: a PNG grid, terminal heatmaps, alignment scores."""
    if over_training or gif is not None:
        check_over_training(over_training, {"--input": input_text, "--kind": kind,
                                            "--head": head, "--no-terminal": terminal,
                                            "--checkpoint": checkpoint, "--threads": threads})
        return show_over_training(run, layer, out, gif, force)
    options = VisualizeOptions(input_text, kind, layer, head, out, force)
    with claim_threads(threads) as claim:
        from minitfm.lab.visualize import check_options, visualize

        claim.apply()
        check_options(options)  # before the checkpoint is read
        report = visualize(loaded_run(run, checkpoint), options)
    if report.note:
        note(report.note)
    for item in attention_text(report, terminal, console.width, widest):
        if isinstance(item, str):
            say(item)
        else:
            show(item)
    console.print(f"wrote {printable(str(report.png))}", markup=False, highlight=False,
                  soft_wrap=True)  # a path, never cut in two


# What --over-training leaves unused: their defaults (a value the drawing agrees with, too).
OVER_TRAINING_UNUSED = {"--input": (None,), "--kind": ("all", "cross"), "--head": (None,),
                        "--no-terminal": (True,), "--checkpoint": ("best",),
                        "--threads": ("auto",)}


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


def show_over_training(run: Path | None, layer: int | None, out: Path | None,
                       gif: Path | None, force: bool = False) -> None:
    """`visualize-attention --over-training`: a table of the heads' scores per step, the files."""
    from minitfm.lab.timeline import over_training

    report = over_training(run, layer, out, gif, force)
    if report.note:
        err_console.print(f"note: {report.note}", markup=False)
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(f"{printable(str(report.timeline.run_dir))} · cross-attention over training",
                  **plain)
    show(over_training_table(report))
    for path in (report.png, report.gif):
        if path is not None:
            console.print(f"wrote {printable(str(path))}", **plain)  # a path, never cut in two


@app.command()
@clean_errors
def plot(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[RUN]...", help="Run directories (or checkpoints in them) to overlay; "
        "default: the most recent run under ./runs."),
    out: Path | None = typer.Option(None, help="PNG path (default: plot.png in the run "
                                    "directory; for several runs, in the folder holding the "
                                    "first, e.g. runs/plot.png)."),
    force: bool = typer.Option(False, "--force", help="Replace --out even if it is not a "
                               "picture minitfm wrote."),
) -> None:
    """Plot loss and exact match against step, several runs overlaid (no TensorBoard needed)."""
    from minitfm.lab.plots import plot_runs

    notes: list[str] = []
    path = plot_runs(runs or [], out, force, notes)
    for note in notes:
        err_console.print(f"note: {printable(note)}", markup=False)
    console.print(f"wrote {printable(str(path))}", markup=False, highlight=False, soft_wrap=True)


def widest(renderable) -> int:
    """The cells the widest line of `renderable` takes (of a Columns: of its widest item)."""
    parts = getattr(renderable, "renderables", [renderable])
    unbounded = console.options.update_width(PIPED_WIDTH)  # measures are capped at the width
    return max((console.measure(part, options=unbounded).maximum for part in parts), default=0)


@app.command()
@clean_errors
def ablate(
    run: Path | None = typer.Argument(None, metavar="[RUN]", help=RUN_HELP),
    mode: str = option(AblateOptions, "mode"),
    samples: int = option(AblateOptions, "samples"),
    checkpoint: str = typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP),
    batch_size: int = option(AblateOptions, "batch_size"),
    out: Path | None = option(AblateOptions, "out"),
    force: bool = option(AblateOptions, "force"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of "
                                 "tables."),
    threads: str = typer.Option("auto", metavar="auto|N", help=THREADS_HELP),
) -> None:
    """Which heads matter: exact match with each attention head, then each layer, switched off."""
    options = AblateOptions(mode, samples, batch_size, out, force)
    with claim_threads(threads) as claim:
        from minitfm.lab.ablate import ablate, check_options

        claim.apply()
        check_options(options)  # before RUN is looked for
        report = ablate(loaded_run(run, checkpoint), options)
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    for renderable in ablation_tables(report):
        show(renderable)
    console.print(f"wrote {printable(str(report.png))}", markup=False, highlight=False,
                  soft_wrap=True)


@app.command()
@clean_errors
def explore(
    run: Path | None = typer.Argument(None, metavar="[RUN]", help=RUN_HELP),
    out: Path | None = typer.Option(None, metavar="FILE", help="HTML path (default: "
                                    "explorer.html in the run directory; for a .pt outside "
                                    "any run, a file beside it)."),
    open_page: bool = typer.Option(False, "--open", help="Open the page in your browser."),
    checkpoint: str = typer.Option("best", metavar="best|last", help=CHECKPOINT_HELP),
) -> None:
    """Write one offline web page where the trained model runs: type inputs, watch decoding
    and every attention map, switch heads off, scrub attention over training."""
    from minitfm.lab.explorer import check_page_path, write_explorer

    if out is not None:
        check_page_path(out)  # before the checkpoint is read
    page = write_explorer(loaded_run(run, checkpoint), out)
    console.print(f"wrote {page.path} ({page.size / 1000:,.0f} kB)", markup=False,
                  highlight=False, soft_wrap=True)
    if open_page:
        import webbrowser

        if not webbrowser.open(page.path.resolve().as_uri()):
            console.print("(no browser found here: open the file above in one)", markup=False,
                          highlight=False)


@app.command()
@clean_errors
def tasks() -> None:
    """List the tasks (synthetic ones, and pairs read from your files) with an example each."""
    show(tasks_table())


@app.command()
@clean_errors
def bench(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    quick: bool = typer.Option(False, "--quick", help="Fewer repetitions, default size only "
                               "(seconds; for tests and a first look)."),
    solve: bool = typer.Option(False, "--solve", help="Also train the default config from "
                               "scratch: wall seconds and steps to 99% exact match, against "
                               "plain nn.Transformer and x-transformers trainers."),
    compile_: bool = typer.Option(False, "--compile", help="Add torch.compile variants."),
    device: str = typer.Option("auto", metavar="DEVICE",
                               help="auto, cpu, cuda or cuda:N."),
    threads: str = typer.Option("auto", metavar="auto|N", help=THREADS_HELP),
) -> None:
    """Measure training throughput against nn.Transformer, MFU, decoding, memory, time to solve."""
    from minitfm.config import check_device
    from minitfm.run.threads import cores

    check_device(device)
    load = {"load_average": os.getloadavg()[0], "cores": cores()}
    if load["load_average"] > load["cores"]:
        err_console.print(f"warning: load average {load['load_average']:.1f} on "
                          f"{load['cores']} cores: other work is running, so these figures are "
                          f"not meaningful", markup=False)
    with claim_threads(threads) as claim:
        from minitfm.lab.bench import run_bench

        claim.apply()
        report = {**load, **run_bench(quick=quick, solve=solve, compile_=compile_,
                                      device=device)}
    if as_json:
        print(json.dumps(report))
    else:
        for table in bench_tables(report):
            show(table)


@app.command()
@clean_errors(uses_torch=False)
def sweep(
    args: list[str] = typer.Argument(
        ..., metavar="CONFIG [KEY=V1,V2,...]...",
        help="A YAML config, then the grid: KEY=V1,V2 sweeps a key, KEY=V sets it in every run "
             "(e.g. model.positional=sinusoidal,rope model.random_positions=null,64)."),
    seeds: str | None = typer.Option(None, metavar="N,N,...",
                                     help="Seeds to sweep, e.g. 0,1,2 (= seed=0,1,2)."),
    jobs: int | None = typer.Option(None, min=1, help="Runs at once (default: as many as "
                                    "the cores hold at one thread each); each is a process of "
                                    "its own, ~300 MB with torch plus its run."),
    threads: int | None = typer.Option(None, min=1, help="Threads per job (default: 1, or "
                                       "cores // --jobs); jobs x threads may not exceed the "
                                       "cores."),
    eval_lengths: list[str] | None = typer.Option(
        None, "--eval-lengths", metavar="A..B", help="Also evaluate on these input lengths "
        "(repeatable); the trained range always is."),
    eval_samples: int = typer.Option(1000, min=1, max=MAX_SAMPLES,
                                     help="Held-out sequences per evaluation."),
    name: str | None = typer.Option(None, metavar="NAME",
                                    help="Sweep name (default: the config's file name, other "
                                    "characters than letters, digits, '_', '-', '.' as '_')."),
    out: Path | None = typer.Option(None, help="Sweep folder: a new or empty one, or this "
                                    "sweep's own (default: a new sweep-<name>-<timestamp> in "
                                    "log.dir, or the one that holds this same grid and base "
                                    "config)."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Leave out the "
                                      "combinations that fail validation instead of refusing "
                                      "the grid (e.g. model.positional=none with a "
                                      "value for model.random_positions)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print one shell command line per "
                                 "run that still has work, and exit."),
) -> None:
    """Train a grid of configs in parallel, evaluate each, and compare them in one table."""
    from minitfm.lab.sweep import dry_run_lines, prepare, run_sweep

    config, items = split_config_args(args, allow_config=True)
    plan = prepare(config, items, seeds=seeds, name=name, out=out, jobs=jobs, threads=threads,
                   eval_lengths=eval_lengths or [], samples=eval_samples,
                   skip_invalid=skip_invalid)
    if dry_run:
        if plan.note:  # stdout stays the shell lines alone
            err_console.print(f"note: {printable(plan.note)}", markup=False, highlight=False)
        for line in dry_run_lines(plan):
            print(line)
        return
    result = run_sweep(plan, say)
    show(sweep_table(result.rows, result.keys, f"sweep {plan.folder}"))
    say(f"wrote {plan.folder / 'results.jsonl'}, results.csv and results.png")
    if result.failed:
        fail(f"{len(result.failed)} of {len(plan.runs)} runs failed "
             f"({', '.join(result.failed)}): see their .log files in {plan.folder}", 1)


@app.command("runs")
@clean_errors(uses_torch=False)
def runs_command(
    folder: Path = typer.Argument(Path("runs"), metavar="[DIR]",
                                  help="A folder of runs (and sweep folders), or a sweep folder."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List the runs: task, changes from the defaults, steps, best exact match, status."""
    from minitfm.lab.runs import list_runs

    rows = list_runs(folder)
    for row in rows:  # a damaged run is listed, and this says why
        if "note" in row:
            damaged = " is unreadable" if row["status"] == "unreadable" else ""
            err_console.print(f"note: run '{printable(row['name'])}'{damaged}: "
                              f"{printable(row['note'])}", markup=False)
    if as_json:
        print(json.dumps(rows, default=str))  # a hand-edited config may hold dates
    elif rows:
        show(runs_table(rows, f"runs under {folder}"))
    else:
        console.print(f"no runs under {printable(str(folder))}", markup=False,
                      highlight=False)


def main() -> None:
    """Console-script entry point."""
    app()
