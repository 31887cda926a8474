"""`minitfm train`: a model trained on a synthetic task (a config and KEY=VALUE overrides), its
progress on the console; Ctrl-C saves a checkpoint that --resume continues from."""

from __future__ import annotations

from pathlib import Path

import typer

from minitfm.app.arguments import split_config_args
from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import console, err_console, warn
from minitfm.errors import MinitfmError


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
