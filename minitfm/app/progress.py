"""Live training progress: a rich progress bar on a terminal, plain log lines elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task
from rich.table import Column, Table
from rich.text import Text

from minitfm.app.text import printable, shell_quote
from minitfm.errors import shown_path
from minitfm.run.instruments import (
    Ended,
    Evaluation,
    GaugesDue,
    Instrument,
    Note,
    Started,
    Stepped,
    TrainLine,
    ending,
)

MIN_BAR = 10  # cells of bar kept at any width: the figures beside it give way first
ENDINGS = {"finished": "done", "stopped at target": "target reached",
           "interrupted": "interrupted", "paused": "paused"}  # the bar's last word


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


def clock(seconds: float) -> str:
    """`1:05` or `1:02:05`: short enough to leave room for the bar at 80 columns."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"


def step_text(task: Task) -> str:
    """`step  35/400`, as wide at the first step as at the last."""
    total = f"{task.total:.0f}"
    return f"step {task.completed:>{len(total)}.0f}/{total}"


class StepColumn(ProgressColumn):
    """`step  35/400` before the bar."""

    def __init__(self):
        # no_wrap: when the figures leave the bar little room, rich would otherwise squeeze
        # this column along with the bar and wrap `35/400` onto a line of its own
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        return Text(step_text(task))


class FiguresColumn(ProgressColumn):
    """Loss, exact match, lr, tokens/s, elapsed time and ETA: as many as the width holds, the
    most telling kept first (ETA, loss, exact match), so that none is ever cut to `…`."""

    def __init__(self, console: Console):
        super().__init__(table_column=Column(no_wrap=True))
        self.console = console

    def render(self, task: Task) -> Text:
        room = self.console.width - len(step_text(task)) - MIN_BAR - 2  # 2 gaps between columns
        return Text(fit(figures(task), room))


def figures(task: Task) -> list[tuple[int, str]]:
    """(rank, text) in the order shown; rank 0 is the last to give way."""
    f = task.fields
    if f["end"]:
        last = f["end"]
    elif task.time_remaining is not None:  # known once a few steps have been timed
        last = f"ETA {clock(task.time_remaining)}"
    else:
        last = ""
    return [(1, f"loss {f['loss']}"), (2, f"exact {f['exact']}"), (3, f["gauge"]),
            (4, f["forecast"]), (6, f"lr {f['lr']}"), (5, f["speed"]),
            (7, f"elapsed {clock(task.elapsed or 0)}"), (0, last)]


def fit(parts: list[tuple[int, str]], room: int) -> str:
    """The parts that fit in `room` cells, two spaces apart, dropped from the highest rank."""
    shown = [text for _, text in parts if text]
    for _, text in sorted(parts, reverse=True):
        if len("  ".join(shown)) <= room:
            break
        if text in shown:
            shown.remove(text)
    return "  ".join(shown)


class ConsoleReporter(Instrument):
    """Shows step, loss, exact match, lr, tokens/s and ETA; at the end why the run stopped, a
    summary table and the commands to try next (an instrument: see `run.instruments`)."""

    def __init__(self, console: Console | None = None, err_console: Console | None = None):
        self.console = console or Console()
        self.err_console = err_console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self.progress: Progress | None = None
        self.task_id = None
        self.exact_match = "-"
        self.gauge = self.forecast = ""  # the latest reading's gauge and forecast (see gauges)
        self.gauges: dict[int, float] = {}  # step -> the gauge shown, for its arrow
        self.log_every = 1
        self.target: float | None = None
        self.tensorboard = False
        self.book: str | None = None  # a learner's workbook the run trained with
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

    def on_note(self, note: Note) -> None:
        """A warning or a note aside: one line on stderr, before the run starts; a note
        between lines (the thread count changed)."""
        if note.warning or note.aside:
            kind = "warning" if note.warning else "note"
            self.err_console.print(f"{kind}: {printable(note.text)}", markup=False)
        else:
            self._print(printable(note.text), highlight=False)

    def on_start(self, run: Started) -> None:
        """The run directory, task, model size and device; then the bar, on a terminal."""
        cfg, device = run.cfg, run.device
        self.target, self.tensorboard = cfg.train.target_exact_match, cfg.log.tensorboard
        self.log_every = cfg.log.log_every
        if run.step:  # a resume: the latest evaluation so far, until the next one
            self.exact_match = latest_exact_match(run.run_dir, run.step)
        self.book = cfg.model.code if run.code.startswith(("workbook ", "bug zoo ")) else None
        self._print(f"run directory: {printable(shown_path(run.run_dir))}", markup=False,
                    highlight=False)
        params = sum(p.numel() for p in run.model.parameters())
        threads = f", {run.threads}" if run.threads and device.type == "cpu" else ""
        self._print(f"task {cfg.task.name} ({run.task.describe()}), {params:,} parameters, "
                    f"code {printable(run.code)}, device {device}{threads}, "
                    f"steps {run.step}/{cfg.train.steps}", markup=False, highlight=False)
        if run.whose:  # a workbook's run: whose functions train
            self._print(printable(run.whose), markup=False, highlight=False)
        if run.ranks > 1:  # under torchrun only rank 0 reports, for all of them
            self._print(f"{run.ranks} ranks × train.batch_size {cfg.train.batch_size} = "
                        f"global batch {run.ranks * cfg.train.batch_size} sequences per step",
                        highlight=False)
        if self.live:
            bar = BarColumn(bar_width=None, table_column=Column(max_width=50))  # fills the rest
            self.progress = Progress(StepColumn(), bar, FiguresColumn(self.console),
                                     console=self.console)
            self.progress.start()
            self.task_id = self.progress.add_task(
                "train", total=cfg.train.steps, completed=run.step, loss="-",
                exact=self.exact_match, gauge="", forecast="", lr="-", speed="", end="")

    def on_step(self, stepped: Stepped) -> None:
        """After every step: the bar moves (its figures change at each train line)."""
        if self.progress is not None:
            self.progress.update(self.task_id, completed=stepped.step)

    def on_train_line(self, line: TrainLine) -> None:
        """The bar's figures on a terminal, else one log line."""
        figures = {"loss": f"{line.loss:.4f}", "lr": f"{line.lr:.2e}",
                   "speed": f"{line.tokens_per_s:,.0f} tok/s"}
        if self.progress is not None:
            self.progress.update(self.task_id, completed=line.step, **figures)
        else:
            gauges = "".join(f"  {text}" for text in (self.gauge, self.forecast) if text)
            self._print(f"step {line.step:>6}  loss {figures['loss']}  exact "
                        f"{self.exact_match}{gauges}  lr {figures['lr']}  {figures['speed']}",
                        highlight=False)

    def on_gauges(self, due: GaugesDue) -> None:
        """The gauge reader's reading: the gauge it shows (the best head's alignment, else the
        token accuracy, or the task's own) with the way it moved since the reading a train
        line ago (the line above, in a log), and the forecast; shown with the next train
        line."""
        reading = due.reading
        if not reading:
            return
        name, value = reading["shown"]  # the gauge reader's choice (lab/watch/gauges.py)
        before = [step for step in self.gauges if step <= due.step - self.log_every]
        self.gauges[due.step] = value
        arrow = trend(self.gauges[max(before)], value) if before else ""
        self.gauge = f"{name} {value:.2f}{arrow}"
        self.forecast = (reading.get("forecast") or {}).get("text", "")
        if self.progress is not None:
            self.progress.update(self.task_id, gauge=self.gauge, forecast=self.forecast)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        """One line per evaluation, terminal or not."""
        step = evaluation.step
        # Between evaluations the progress shows this one's figure: its step says how old it is.
        self.exact_match = f"{evaluation.exact_match:.1%} (step {step})"
        if self.progress is not None:
            self.progress.update(self.task_id, exact=self.exact_match)
        self._print(f"eval step {step:>6}  loss {evaluation.loss:.4f}  token acc "
                    f"{evaluation.token_accuracy:.2%}  exact match {evaluation.exact_match:.2%}",
                    highlight=False)

    def stop(self, end: str = "stopped", step: int | None = None) -> None:
        """Leave the bar's last frame saying how it ended, instead of an ETA."""
        if self.progress is not None:
            completed = {} if step is None else {"completed": step}
            self.progress.update(self.task_id, end=end, **completed)
            self.progress.stop()
            self.progress = None

    def on_end(self, ended: Ended) -> None:
        """Why the run ended, its figures, and what to try next."""
        summary = ended.summary
        self.stop(ENDINGS[summary["status"]], summary["step"])
        self._print(Text(ending(summary, self.target), style="bold"))
        self._print(summary_table(summary))
        self._print("next:", highlight=False)
        for command in next_commands(summary, self.tensorboard, self.book):  # to paste whole
            self._print(f"  {command}", markup=False, highlight=False, soft_wrap=True)


def trend(before: float, now: float, still: float = 0.01) -> str:
    """↑, ↓ or → (within `still` of `before`)."""
    return "↑" if now > before + still else "↓" if now < before - still else "→"


def latest_exact_match(run_dir: Path, step: int) -> str:
    """`99.4% (step 230)`: the run's latest evaluation up to `step` in its metrics.jsonl, as
    the progress shows one; `-` when it has none."""
    from minitfm.lab.curves import read_metrics

    evals = [r for r in read_metrics(run_dir) if r["split"] == "eval" and r["step"] <= step]
    if not evals:
        return "-"
    return f"{evals[-1]['exact_match']:.1%} (step {evals[-1]['step']})"


def summary_table(summary: dict) -> Table:
    """The run's figures, one per row."""
    table = Table(show_header=False)
    table.add_column()
    table.add_column(overflow="fold")  # a long run directory folds, never ends in `…`
    table.add_row("run directory", Text(printable(shown_path(summary["run_dir"]))))  # no markup
    table.add_row("steps", f"{summary['step']} of {summary['steps']}")
    table.add_row("wall time", f"{summary['wall_s']:.1f} s")
    for key in ("exact_match", "token_accuracy", "loss"):
        if key in summary:
            value = summary[key]
            table.add_row(key.replace("_", " "), f"{value:.4f}" if key == "loss"
                          else f"{value:.2%}")
    table.add_row("best exact match", f"{max(summary['best_exact_match'], 0):.2%}")
    if summary.get("peak_rss_mb"):
        table.add_row("peak memory (RSS)", f"{summary['peak_rss_mb']:.0f} MB")
    return table


def next_commands(summary: dict, tensorboard: bool, book: str | None = None) -> list[str]:
    """What to try next with this run, ready to paste: the README's Start here, in its order;
    with `--book` for a run of a learner's workbook (its code runs only when asked)."""
    run = shell_quote(shown_path(summary["run_dir"]))
    yours = "" if book is None else f" --book {shell_quote(shown_path(book))}"
    commands = [f"minitfm eval {run}{yours}", f"minitfm visualize-attention {run}{yours}",
                f"minitfm ablate {run}{yours}", f"minitfm explore {run}"]
    if summary["status"] in ("interrupted", "paused"):
        commands.insert(0, f"minitfm train --resume {run}")
    if tensorboard:
        commands.append(tensorboard_command(Path(summary["run_dir"])))
    return commands


def tensorboard_command(run_dir: Path) -> str:
    """`make tensorboard` where it serves this run (a checkout, the run under ./runs), else
    TensorBoard on the run itself."""
    if Path("Makefile").is_file() and Path("runs").resolve() in run_dir.resolve().parents:
        return "make tensorboard"
    return f"tensorboard --logdir {shell_quote(shown_path(run_dir))}"
