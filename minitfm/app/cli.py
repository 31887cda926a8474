"""The `minitfm` command line: thin commands over the library, one Typer function each.

Only the face prints: the console, the shared options, one-line errors and exit codes (0
success, 1 runtime failure, 2 bad input, 130 interrupted by Ctrl-C, 143 by SIGTERM) are
`app/console.py`'s; the tables are `app/tables.py`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from minitfm.app import compare, explain, predict, stacked
from minitfm.app.arguments import split_config_args
from minitfm.app.console import (
    App,
    OneLineErrors,
    book_option,
    check_over_training,
    checkpoint_option,
    claimed_threads,
    clean_errors,
    console,
    err_console,
    fail,
    force_option,
    json_option,
    loaded_run,
    note,
    option,
    run_argument,
    say,
    show,
    threads_option,
    warn,
    widest,
    wrote,
)
from minitfm.app.explore import explore
from minitfm.app.learn import learn_app
from minitfm.app.tables import (
    ablation_tables,
    attention_text,
    bench_tables,
    over_training_table,
    per_length_table,
    printable,
    runs_table,
    sweep_table,
    tasks_table,
)
from minitfm.errors import MinitfmError, shown_path
from minitfm.lab.options import (
    AblateOptions,
    EvalOptions,
    SweepOptions,
    VisualizeOptions,
    seeds_once,
)
from minitfm.run.files import to_json
from minitfm.version import __version__

app = App(
    cls=OneLineErrors,
    name="minitfm",
    help="A toy encoder-decoder transformer trainer: hand-written attention, synthetic tasks, "
         "attention maps you can see.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


app.add_typer(learn_app, name="learn")


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
    book: Path | None = typer.Option(None, "--book", metavar="DIR", help="Train with a "
                                     "workbook's code (minitfm learn): its functions where "
                                     "written, the book's elsewhere (sets model.code)."),
) -> None:
    """Train a model on a synthetic task; Ctrl-C saves a checkpoint you can --resume."""
    from minitfm.config import check_given_once, load_config, to_yaml

    config_path, overrides = split_config_args(args or [], allow_config=resume is None)
    check_given_once(overrides)  # `train.steps=2 train.steps=3`: which one did you mean?
    if book is not None:  # a path as it is, not read as YAML
        overrides = [*overrides, ("model.code", str(book.resolve()))]
    if resume is not None:
        from minitfm.run.which_run import resolve_checkpoint
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


@app.command("eval")
@clean_errors
def eval_command(
    run: Path | None = run_argument(),
    checkpoint: str = checkpoint_option(),
    samples: int = option(EvalOptions, "samples"),
    min_len: int | None = option(EvalOptions, "min_len"),
    max_len: int | None = option(EvalOptions, "max_len"),
    seed: int | None = option(EvalOptions, "seed"),
    batch_size: int = option(EvalOptions, "batch_size"),
    as_json: bool = json_option("Print one JSON object instead of tables."),
    plot: Path | None = typer.Option(None, "--plot", metavar="FILE", help="Also draw exact "
                                     "match per length as a PNG bar chart (trained lengths and "
                                     "beyond in two colours)."),
    force: bool = force_option("the --plot file"),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Measure a trained run honestly: greedy decoding on held-out data, per-length table."""
    if plot is not None:
        from minitfm.lab.pictures import check_output

        check_output(plot, "--plot", force)  # before the decoding, not after
    options = EvalOptions(samples, min_len, max_len, seed, batch_size)
    with claimed_threads(threads):
        from minitfm.lab.measure.evaluate import eval_report

        loaded = loaded_run(run, checkpoint, book)
        with loaded.running(as_json):
            report = eval_report(loaded, options)
    if as_json:
        print(to_json(report))
    else:
        show(per_length_table(report))
    if plot is not None:
        from minitfm.lab.measure.evaluate import length_chart

        length_chart(report, plot, force)
        wrote(plot, err_console if as_json else console)  # --json: stdout stays one document


app.registered_commands += predict.app.registered_commands  # predict (app/predict.py)


@app.command("visualize-attention")
@clean_errors
def visualize_attention(
    run: Path | None = run_argument(),
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
    checkpoint: str = checkpoint_option(),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Show what every attention head does: a PNG grid, terminal heatmaps, alignment scores."""
    if over_training or gif is not None:
        check_over_training(over_training, {"--input": input_text, "--kind": kind,
                                            "--head": head, "--no-terminal": terminal,
                                            "--checkpoint": checkpoint, "--threads": threads,
                                            "--book": book})
        return show_over_training(run, layer, out, gif, force)
    options = VisualizeOptions(input_text, kind, layer, head, out, force)
    with claimed_threads(threads):
        from minitfm.lab.look.visualize import check_options, visualize

        check_options(options)  # before the checkpoint is read
        loaded = loaded_run(run, checkpoint, book)
        with loaded.running():
            report = visualize(loaded, options)
    if report.note:
        note(report.note)
    for item in attention_text(report, terminal, console.width, widest):
        if isinstance(item, str):
            say(item)
        else:
            show(item)
    wrote(report.png)


def show_over_training(run: Path | None, layer: int | None, out: Path | None,
                       gif: Path | None, force: bool = False) -> None:
    """`visualize-attention --over-training`: a table of the heads' scores per step, the files."""
    from minitfm.lab.look.over_training import over_training

    report = over_training(run, layer, out, gif, force)
    if report.note:
        note(report.note)
    console.print(printable(shown_path(report.timeline.run_dir)) + " · cross-attention over "
                  "training", markup=False, highlight=False, soft_wrap=True)
    show(over_training_table(report))
    for path in (report.png, report.gif):
        if path is not None:
            wrote(path)


@app.command()
@clean_errors
def plot(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[RUN]...", help="Run directories (or checkpoints in them) to overlay; "
        "default: the most recent run under ./runs."),
    out: Path | None = typer.Option(None, help="PNG path (default: plot.png in the run "
                                    "directory; for several runs, in the folder holding the "
                                    "first, e.g. runs/plot.png)."),
    force: bool = force_option("--out"),
) -> None:
    """Plot loss and exact match against step, several runs overlaid (no TensorBoard needed)."""
    from minitfm.lab.many.plots import plot_runs

    notes: list[str] = []
    path = plot_runs(runs or [], out, force, notes)
    for line in notes:
        note(line)
    wrote(path)


@app.command()
@clean_errors
def ablate(
    run: Path | None = run_argument(),
    mode: str = option(AblateOptions, "mode"),
    samples: int = option(AblateOptions, "samples"),
    checkpoint: str = checkpoint_option(),
    batch_size: int = option(AblateOptions, "batch_size"),
    out: Path | None = option(AblateOptions, "out"),
    force: bool = option(AblateOptions, "force"),
    as_json: bool = json_option("Print one JSON object instead of tables."),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """Which heads matter: exact match with each attention head, then each layer, switched off."""
    options = AblateOptions(mode, samples, batch_size, out, force)
    with claimed_threads(threads):
        from minitfm.lab.look.ablate import ablate, check_options

        check_options(options)  # before RUN is looked for
        loaded = loaded_run(run, checkpoint, book)
        with loaded.running(as_json):
            report = ablate(loaded, options)
    if as_json:
        print(to_json(report.as_dict()))
        return
    for renderable in ablation_tables(report):
        show(renderable)
    wrote(report.png)


app.registered_commands += explain.app.registered_commands  # explain, patch (app/explain.py)
app.registered_commands += compare.app.registered_commands  # compare (app/compare.py)
app.registered_commands += stacked.app.registered_commands  # stack, hidden (app/stacked.py)
app.command()(explore)  # app/explore.py


@app.command()
@clean_errors
def tasks() -> None:
    """List the tasks (synthetic ones, and pairs read from your files) with an example each."""
    show(tasks_table())


@app.command()
@clean_errors
def bench(
    as_json: bool = json_option("Print JSON instead of tables."),
    quick: bool = typer.Option(False, "--quick", help="Fewer repetitions, default size only "
                               "(seconds; for tests and a first look)."),
    solve: bool = typer.Option(False, "--solve", help="Also train the default config from "
                               "scratch: wall seconds and steps to 99% exact match, against "
                               "plain nn.Transformer and x-transformers trainers."),
    compile_: bool = typer.Option(False, "--compile", help="Add torch.compile variants."),
    stacks: str | None = typer.Option(None, "--stacks", metavar="K,K,...", help="Also runs a "
                                      "minute of whole default sweeps of K seeds stacked (1: "
                                      "alone), e.g. 1,16,64,256 on a GPU."),
    device: str = typer.Option("auto", metavar="DEVICE", help="auto, cpu, cuda or cuda:N."),
    threads: str = threads_option(),
) -> None:
    """Measure training throughput against nn.Transformer, MFU, decoding, memory, time to solve."""
    from minitfm.config import check_device
    from minitfm.lab.options import stack_sizes
    from minitfm.run.threads import cores

    check_device(device)
    sizes = stack_sizes(stacks)  # refused before any measuring, or any warning
    load = {"load_average": os.getloadavg()[0], "cores": cores()}
    if load["load_average"] > load["cores"]:
        warn(f"load average {load['load_average']:.1f} on {load['cores']} cores: other work "
             f"is running, so these figures are not meaningful")
    with claimed_threads(threads):
        from minitfm.lab.measure.bench import run_bench

        report = {**load, **run_bench(quick=quick, solve=solve, compile_=compile_,
                                      device=device, stacks=sizes)}
    if as_json:
        print(to_json(report))
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
    seeds: list[str] | None = option(SweepOptions, "seeds"),
    jobs: int | None = option(SweepOptions, "jobs"),
    threads: int | None = option(SweepOptions, "threads"),
    eval_lengths: list[str] | None = option(SweepOptions, "eval_lengths"),
    eval_samples: int = option(SweepOptions, "eval_samples"),
    name: str | None = option(SweepOptions, "name"),
    out: Path | None = option(SweepOptions, "out"),
    skip_invalid: bool = option(SweepOptions, "skip_invalid"),
    on: str = option(SweepOptions, "on"),
    ray_address: str | None = option(SweepOptions, "ray_address"),
    stack: bool | None = option(SweepOptions, "stack"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print one shell command line per "
                                 "run that still has work, and exit."),
) -> None:
    """Train a grid of configs in parallel, evaluate each, and compare them in one table."""
    from minitfm.lab.many.sweep import dry_run_lines, prepare, run_sweep

    config, items = split_config_args(args, allow_config=True)
    options = SweepOptions(seeds_once(seeds), jobs, threads, eval_lengths, eval_samples, name,
                           out, on, ray_address, stack, skip_invalid)
    plan = prepare(config, items, options)
    if dry_run:
        for text in plan.notes(dry_run=True):  # stdout stays the shell lines alone
            note(text)
        for line in dry_run_lines(plan):
            print(line)
        return
    result = run_sweep(plan, say)
    folder = shown_path(plan.folder)
    show(sweep_table(result.rows, result.keys, f"sweep {folder}"))
    intervals = ", intervals.png" if (plan.folder / "intervals.png").is_file() else ""
    say(f"wrote {shown_path(plan.folder / 'results.jsonl')}, results.csv, results.png, "
        f"configurations.jsonl, configurations.csv{intervals}")
    if result.failed:
        fail(f"{len(result.failed)} of {len(plan.runs)} runs failed "
             f"({', '.join(result.failed)}): see their .log files in {folder}", 1)


@app.command("runs")
@clean_errors(uses_torch=False)
def runs_command(
    folder: Path = typer.Argument(Path("runs"), metavar="[DIR]",
                                  help="A folder of runs (and sweep folders), or a sweep folder."),
    as_json: bool = json_option("Print a JSON list instead of a table."),
) -> None:
    """List the runs: task, changes from the defaults, steps, best exact match, status."""
    from minitfm.lab.many.runs import list_runs

    rows = list_runs(folder)
    for row in rows:  # a damaged run is listed, and this says why
        if "note" in row:
            damaged = " is unreadable" if row["status"] == "unreadable" else ""
            note(f"run '{row['name']}'{damaged}: {row['note']}")
    if as_json:
        print(to_json(rows, default=str))  # a hand-edited config may hold dates
    elif rows:
        show(runs_table(rows, f"runs under {shown_path(folder)}"))
    else:
        say(f"no runs under {shown_path(folder)}")


def main() -> None:
    """Console-script entry point."""
    app()
