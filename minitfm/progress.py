"""Live training progress: a rich progress bar on a terminal, plain log lines elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


def silence(stream) -> None:
    """Point a stream whose reader has gone at /dev/null, so later writes and the flush at
    exit stay quiet instead of printing "Exception ignored ... BrokenPipeError"."""
    try:
        stream.flush()
    except OSError:
        pass
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (AttributeError, ValueError, OSError):  # not a real file (a test's buffer)
        pass


class ConsoleReporter:
    """Shows step, loss, exact match, lr, tokens/s and ETA; a summary table at the end."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console()
        self.live = self.console.is_terminal
        self.progress: Progress | None = None
        self.task_id = None
        self.exact_match: float | None = None
        self.output_lost = False
        # rich exits the program when the reader of stdout goes away (`minitfm train | head`);
        # a training run should rather go on quietly and save its checkpoints.
        self.console.on_broken_pipe = self._output_gone

    def _print(self, *args, **kwargs) -> None:
        """Print, unless the output has gone (`minitfm train | head`): training goes on."""
        if self.output_lost:
            return
        try:
            self.console.print(*args, **kwargs)
        except OSError:  # a full disk: stop printing, keep training
            self._output_gone()

    def _output_gone(self) -> None:
        self.output_lost = self.console.quiet = True
        silence(self.console.file)

    def start(self, run_dir: Path, state, device, threads: str = "") -> None:
        cfg = state.cfg
        self._print(f"run directory: {run_dir}")
        params = sum(p.numel() for p in state.model.parameters())
        threads = f", {threads}" if threads and device.type == "cpu" else ""
        self._print(f"task {cfg.task.name} ({state.task.describe()}), {params:,} parameters, "
                    f"device {device}{threads}, steps {state.step}/{cfg.train.steps}",
                    highlight=False)
        ranks = state.dist.world_size  # under torchrun only rank 0 reports, for all of them
        if ranks > 1:
            self._print(f"{ranks} ranks × train.batch_size {cfg.train.batch_size} = "
                        f"global batch {ranks * cfg.train.batch_size} sequences per step",
                        highlight=False)
        if self.live:
            self.progress = Progress(
                TextColumn("step {task.completed:>5.0f}/{task.total:.0f}"), BarColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=self.console, transient=False)
            self.progress.start()
            self.task_id = self.progress.add_task("train", total=cfg.train.steps,
                                                  completed=state.step, info="")

    def train_line(self, record: dict) -> None:
        em = "-" if self.exact_match is None else f"{self.exact_match:.1%}"
        info = (f"loss {record['loss']:.4f}  exact {em}  lr {record['lr']:.2e}  "
                f"{record['tokens_per_s']:,.0f} tok/s")
        if self.progress is not None:
            self.progress.update(self.task_id, completed=record["step"], info=info)
        else:
            self._print(f"step {record['step']:>6}  {info}", highlight=False)

    def eval_line(self, record: dict) -> None:
        self.exact_match = record["exact_match"]
        line = (f"eval step {record['step']:>6}  loss {record['loss']:.4f}  token acc "
                f"{record['token_accuracy']:.2%}  exact match {record['exact_match']:.2%}")
        if self.progress is not None:
            self._print(line, highlight=False)
        else:
            self._print(line, highlight=False)

    def message(self, text: str) -> None:
        self._print(text, highlight=False)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def finish(self, summary: dict) -> None:
        self.stop()
        table = Table(title="paused" if summary["paused"] else "done", show_header=False)
        table.add_row("run directory", summary["run_dir"])
        table.add_row("steps", str(summary["step"]))
        table.add_row("wall time", f"{summary['wall_s']:.1f} s")
        for key in ("exact_match", "token_accuracy", "loss"):
            if key in summary:
                value = summary[key]
                table.add_row(key.replace("_", " "), f"{value:.4f}" if key == "loss"
                              else f"{value:.2%}")
        table.add_row("best exact match", f"{max(summary['best_exact_match'], 0):.2%}")
        if summary.get("peak_rss_mb"):
            table.add_row("peak memory (RSS)", f"{summary['peak_rss_mb']:.0f} MB")
        self._print(table)
