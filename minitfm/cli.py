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
import unicodedata
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from typer._click.exceptions import ClickException, NoArgsIsHelpError  # Typer's own Click
from typer.core import TyperGroup

from minitfm import __version__
from minitfm.errors import Interrupted, MinitfmError, quote

console = Console()
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class OneLineErrors(TyperGroup):
    """Usage mistakes (unknown option, bad value) as one line on stderr with exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as err:  # bare `minitfm`: the help, which is no error
            if err.format_message().strip():
                console.print(err.format_message(), markup=False, highlight=False)
            code = 0
        except ClickException as err:
            command = f"minitfm {err.ctx.info_name} --help" if getattr(err, "ctx", None) \
                and err.ctx.parent else "minitfm --help"
            err_console.print(f"error: {err.format_message()} (see '{command}')", markup=False)
            code = err.exit_code
        except typer.Abort:
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
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


MAX_ERROR_CHARS = 500  # one line, however long the user's input was


def printable(text: str) -> str:
    """`text` with control characters escaped, so a file name cannot drive the terminal."""
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) == "Cc" else ch for ch in text)


def fail(message: str, code: int = 2):
    """Print one clean error line on stderr and exit with `code`."""
    line = printable(message)
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 1] + "…"
    err_console.print(f"error: {line}", markup=False)
    raise typer.Exit(code)


@contextmanager
def signals_held():
    """Hold Ctrl-C and SIGTERM while torch is imported, then act on them.

    torch's C++ start-up swallows a KeyboardInterrupt raised inside it, and the command would
    then run to the end as if nothing happened.
    """
    got: list[int] = []
    previous = {signum: signal.signal(signum, lambda n, _: got.append(n))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if got:
        raise Interrupted("interrupted" if got[0] == signal.SIGINT else "terminated",
                          128 + got[0])


def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) \
        or "out of memory" in str(err)


def chosen_checkpoint(run: Path | None, which: str) -> Path:
    """The checkpoint file RUN means; a fallback from best.pt to last.pt is a note on stderr."""
    from minitfm.checkpoint import pick_checkpoint

    path, note = pick_checkpoint(run, which)
    if note:
        err_console.print(f"note: {note}", markup=False)
    return path


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
            if uses_torch:
                with signals_held():
                    import torch  # noqa: F401
            return command(*args, **kwargs)
        except MinitfmError as err:
            fail(str(err), err.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
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
    from minitfm.progress import silence

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
    from minitfm.memory import keep_freed_memory

    keep_freed_memory()  # reuse freed activations instead of page-faulting them in every step


@app.command()
@clean_errors
def train(
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
        from minitfm.checkpoint import resolve_checkpoint
        ckpt = resolve_checkpoint(resume, "last")
        if print_config:
            from minitfm.checkpoint import load_checkpoint
            from minitfm.train import resume_config
            console.print(to_yaml(resume_config(load_checkpoint(ckpt), overrides)), end="",
                          markup=False, highlight=False)
            return
        return run_training(None, resume=ckpt, overrides=overrides, run_dir=run_dir,
                            overwrite=overwrite)
    cfg = load_config(config_path, overrides)
    if print_config:
        console.print(to_yaml(cfg), end="", markup=False, highlight=False)
        return
    run_training(cfg, run_dir=run_dir, overwrite=overwrite)


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


def run_training(cfg, **kwargs) -> None:
    from minitfm.threads import ThreadClaim

    # Registered before torch loads, so that other minitfm processes see this one at once;
    # a resumed run's `threads` is known once its checkpoint is read (train updates it).
    with ThreadClaim(cfg.threads if cfg is not None else "auto") as claim:
        from minitfm.progress import ConsoleReporter
        from minitfm.train import train as train_run

        reporter = ConsoleReporter(console)
        try:
            train_run(cfg, reporter=reporter, threads=claim, **kwargs)
        except MinitfmError as err:
            if getattr(err, "echo", False):  # under torchrun rank 0 prints every rank's error
                raise typer.Exit(err.exit_code) from None
            raise
        finally:
            reporter.stop()


def claim_threads(value: str):
    """This process's thread registration for `--threads` (see minitfm.threads)."""
    from minitfm.threads import ThreadClaim, parse_threads

    try:
        return ThreadClaim(parse_threads(value))
    except ValueError as err:
        raise MinitfmError(f"--{err}") from None


@app.command("eval")
@clean_errors
def eval_command(
    run: Path | None = typer.Argument(None, help=RUN_HELP),
    checkpoint: str = typer.Option("best", help=CHECKPOINT_HELP),
    samples: int = typer.Option(1000, min=1, max=100_000, help="Held-out sequences to decode."),
    min_len: int | None = typer.Option(None, min=1, max=65_536, help="Shortest input length "
                                          "(default: the trained task.min_len)."),
    max_len: int | None = typer.Option(None, min=1, max=65_536, help="Longest input length; may "
                                          "go beyond the trained range (default: task.max_len)."),
    seed: int | None = typer.Option(None, min=-(2**63), max=2**63 - 1, help="Seed of the "
                                       "held-out set (default: task.eval_seed)."),
    # 250 is evaluate.EVAL_BATCH_SIZE, written out so that --help need not import torch.
    batch_size: int = typer.Option(250, min=1, max=100_000, help="Sequences decoded at once; "
                                    "lower it to save memory."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of "
                                 "tables."),
    plot: Path | None = typer.Option(None, "--plot", metavar="FILE", help="Also draw exact "
                                     "match per length as a PNG bar chart (trained lengths and "
                                     "beyond in two colours)."),
    force: bool = typer.Option(False, "--force", help="Replace the --plot file even if it is "
                               "not a picture minitfm wrote."),
    threads: str = typer.Option("auto", help=THREADS_HELP),
) -> None:
    """Measure a trained run honestly: greedy decoding on held-out data, per-length table."""
    if plot is not None:
        from minitfm.plots import check_output

        check_output(plot, "--plot", force)  # before the decoding, not after
    with claim_threads(threads) as claim:
        from minitfm.evaluate import eval_tables, evaluate_run

        claim.apply()
        report = evaluate_run(chosen_checkpoint(run, checkpoint), checkpoint, samples, min_len,
                              max_len, seed, batch_size)
    if as_json:
        print(json.dumps(report))
    else:
        for table in eval_tables(report):
            console.print(table)
    if plot is not None:
        from minitfm.plots import length_chart

        length_chart(report, plot, force)
        # beside --json's one object, on stderr: stdout stays one JSON document
        (err_console if as_json else console).print(f"wrote {plot}", markup=False,
                                                    highlight=False, soft_wrap=True)


@app.command()
@clean_errors
def predict(
    run: Path | None = typer.Argument(None, help=RUN_HELP),
    inputs: list[str] | None = typer.Argument(
        None, metavar="[INPUT]...", help="Inputs in task syntax, e.g. '3 1 4', '314' or "
        "'12+34'; none: read one per line from stdin."),
    checkpoint: str = typer.Option("best", help=CHECKPOINT_HELP),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per input, with the "
                                 "expected output and whether it matches."),
    threads: str = typer.Option("auto", help=THREADS_HELP),
) -> None:
    """Decode your own inputs with a trained model, one output line per input."""
    run, inputs = split_run_and_inputs(run, inputs or [])
    if inputs:
        lines, where = inputs, "input"
    elif sys.stdin is None or sys.stdin.closed:
        raise MinitfmError("no input: stdin is closed; give INPUT arguments or pipe one input "
                           "per line")
    else:
        lines, where = sys.stdin.read().splitlines(), "line"
    with claim_threads(threads) as claim:
        from minitfm.evaluate import predict_texts

        claim.apply()
        rows = predict_texts(chosen_checkpoint(run, checkpoint), checkpoint, lines, where)
    for row in rows:
        print(json.dumps(row) if as_json else row["output"])


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
    run: Path | None = typer.Argument(None, help=RUN_HELP),
    input_text: str | None = typer.Option(None, "--input", help="Input in task syntax "
                                          "(default: the held-out example TensorBoard shows)."),
    kind: str = typer.Option("all", help="encoder, decoder, cross or all."),
    layer: int | None = typer.Option(None, help="Only this layer (from 0)."),
    head: int | None = typer.Option(None, help="Only this head (from 0)."),
    out: Path | None = typer.Option(None, help="PNG path (default: <run>/attention/"
                                    "<checkpoint>-step<N>.png; for a .pt outside a run, "
                                    "<name>-attention-step<N>.png beside it)."),
    terminal: bool = typer.Option(True, "--terminal/--no-terminal",
                                  help="Also draw the heatmaps in the terminal; a bare --kind "
                                       "all draws only cross-attention there (the PNG has "
                                       "all kinds)."),
    checkpoint: str = typer.Option("best", help=CHECKPOINT_HELP),
    threads: str = typer.Option("auto", help=THREADS_HELP),
) -> None:
    """Show what every attention head does: a PNG grid, terminal heatmaps, alignment scores."""
    with claim_threads(threads) as claim:
        from minitfm.viz import alignment_table, terminal_legend, terminal_maps, visualize

        claim.apply()
        report = visualize(chosen_checkpoint(run, checkpoint), checkpoint, input_text, kind,
                           layer, head, out)
    fmt, plain = report.task.format, {"markup": False, "highlight": False}
    verdict = "correct" if report.probe.prediction == report.target else "wrong"
    console.print(f"{report.task.name} · {report.checkpoint} · step {report.step}", **plain)
    console.print(f"input:      {fmt(report.probe.src)}", **plain)
    console.print(f"prediction: {fmt(report.probe.prediction)}  ({verdict})", **plain)
    console.print(f"expected:   {fmt(report.target)}", **plain)
    if terminal:
        for renderable in terminal_maps(report.terminal_blocks):
            console.print(renderable)
        console.print(terminal_legend())
        if len(report.terminal_blocks) < len(report.blocks):
            console.print("(terminal: cross-attention only; --kind encoder|decoder or --layer/"
                          "--head for the others, all of them are in the PNG)", **plain)
    console.print(alignment_table(report))
    console.print(f"wrote {report.png}", soft_wrap=True, **plain)  # a path, never cut in two


@app.command()
@clean_errors
def plot(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[RUN]...", help="Run directories (or checkpoints in them) to overlay; "
        "default: the most recent run under ./runs."),
    out: Path | None = typer.Option(None, help="PNG path (default: plot.png in the run "
                                    "directory; for several runs, in the current directory)."),
    force: bool = typer.Option(False, "--force", help="Replace --out even if it is not a "
                               "picture minitfm wrote."),
) -> None:
    """Plot loss and exact match against step, several runs overlaid (no TensorBoard needed)."""
    from minitfm.plots import plot_runs

    path = plot_runs(runs or [], out, force)
    console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


@app.command()
@clean_errors
def tasks() -> None:
    """List the synthetic tasks with an example each."""
    from rich.table import Table

    from minitfm.config import TaskConfig
    from minitfm.tasks import TASKS

    table = Table(title="tasks (task.name)")
    for column in ("name", "what it learns", "example input", "target"):
        table.add_column(column)
    for name, cls in TASKS.items():
        example_in, example_out = cls(TaskConfig(name=name)).example()
        table.add_row(name, cls.summary, example_in, example_out)
    console.print(table)


@app.command()
@clean_errors
def bench(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    quick: bool = typer.Option(False, "--quick", help="Fewer repetitions, default size only "
                               "(seconds; for tests and a first look)."),
    solve: bool = typer.Option(False, "--solve", help="Also train the default config from "
                               "scratch: wall seconds and steps to 99% exact match."),
    compile_: bool = typer.Option(False, "--compile", help="Add torch.compile variants."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    threads: str = typer.Option("auto", help=THREADS_HELP),
) -> None:
    """Measure training throughput against nn.Transformer, MFU, decoding, memory, time to solve."""
    from minitfm.config import check_device
    from minitfm.threads import cores

    check_device(device)
    load = {"load_average": os.getloadavg()[0], "cores": cores()}
    if load["load_average"] > load["cores"]:
        err_console.print(f"warning: load average {load['load_average']:.1f} on "
                          f"{load['cores']} cores: other work is running, so these figures are "
                          f"not meaningful", markup=False)
    with claim_threads(threads) as claim:
        from minitfm.bench import bench_tables, run_bench

        claim.apply()
        report = {**load, **run_bench(quick=quick, solve=solve, compile_=compile_,
                                      device=device)}
    if as_json:
        print(json.dumps(report))
    else:
        for table in bench_tables(report):
            console.print(table)


@app.command()
@clean_errors(uses_torch=False)
def sweep(
    args: list[str] = typer.Argument(
        ..., metavar="CONFIG [KEY=V1,V2,...]...",
        help="A YAML config, then the grid: KEY=V1,V2 sweeps a key, KEY=V sets it in every run "
             "(e.g. model.positional=sinusoidal,rope model.random_positions=null,64)."),
    seeds: str | None = typer.Option(None, help="Seeds to sweep, e.g. 0,1,2 (= seed=0,1,2)."),
    jobs: int | None = typer.Option(None, min=1, help="Runs at once (default: as many as "
                                    "the cores hold at one thread each)."),
    threads: int | None = typer.Option(None, min=1, help="Threads per job (default: 1, or "
                                       "cores // --jobs); jobs x threads may not exceed the "
                                       "cores."),
    eval_lengths: list[str] | None = typer.Option(
        None, "--eval-lengths", metavar="A..B", help="Also evaluate on these input lengths "
        "(repeatable); the trained range always is."),
    eval_samples: int = typer.Option(1000, min=1, max=100_000,
                                     help="Held-out sequences per evaluation."),
    name: str | None = typer.Option(None, help="Sweep name (default: the config's file name)."),
    out: Path | None = typer.Option(None, help="Sweep folder (default: log.dir/sweep-<name>-"
                                    "<timestamp>, or the one that holds this same grid)."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Leave out the "
                                      "combinations that fail validation instead of refusing "
                                      "the grid (e.g. model.positional=none with "
                                      "model.random_positions=64)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print one shell command line per "
                                 "run that still has work, and exit."),
) -> None:
    """Train a grid of configs in parallel, evaluate each, and compare them in one table."""
    from minitfm.sweep import dry_run_lines, prepare, results_table, run_sweep

    config, items = split_config_args(args, allow_config=True)
    plan = prepare(config, items, seeds=seeds, name=name, out=out, jobs=jobs, threads=threads,
                   eval_lengths=eval_lengths or [], samples=eval_samples,
                   skip_invalid=skip_invalid)
    if dry_run:
        for line in dry_run_lines(plan):
            print(line)
        return
    say = functools.partial(console.print, markup=False, highlight=False)
    result = run_sweep(plan, say)
    console.print(results_table(result.rows, result.keys, f"sweep {plan.folder}"))
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
    from minitfm.runs import list_runs, runs_table

    rows = list_runs(folder)
    if as_json:
        print(json.dumps(rows))
    elif rows:
        console.print(runs_table(rows, f"runs under {folder}"))
    else:
        console.print(f"no runs under {folder}", markup=False, highlight=False)


def main() -> None:
    """Console-script entry point."""
    app()
