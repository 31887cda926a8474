"""What minitfm prints: a live bar at 80 columns in a terminal (a real pty), whole lines when
piped, --help that reads plainly, the warmup warning, `interrupted:` for a user's Ctrl-C."""

import fcntl
import io
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer
from rich.cells import cell_len
from rich.console import Console

import minitfm
from minitfm.app.commands.bench import bench_tables
from minitfm.app.exit_codes import clean_errors
from minitfm.app.output import show
from minitfm.app.progress import ConsoleReporter
from minitfm.app.text import heading_lines
from minitfm.config import load_config
from minitfm.errors import shown_path
from minitfm.run.instruments import Started, Stepped, TrainLine
from tests.helpers import TINY, command_names, given_once, run_cli
from tests.imports import imported_modules, read_imports

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FRAME = re.compile(r"step +(\d+)/(\d+) ")  # a frame of the progress bar
COMMANDS = command_names()  # every registered command (test_cli checks --help and README)


def in_terminal(args: list, cwd=None, columns: int = 80, timeout: float = 120) -> tuple[int, str]:
    """Run `python -m minitfm ARGS` in a pseudo-terminal `columns` wide; its exit code and
    everything it drew (stdout and stderr), escape sequences included."""
    main, child = os.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color",
           "OMP_NUM_THREADS": "1"}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "minitfm", *given_once(args)], stdin=child,
                            stdout=child, stderr=child, env=env, close_fds=True, cwd=cwd)
    os.close(child)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([main], [], [], 1)[0]:
                try:
                    data = os.read(main, 65536)
                except OSError:  # EIO: the child has gone and the pty is closed
                    break
                if not data:
                    break
                out += data
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), out.decode("utf-8", errors="replace")


def screen_lines(drawn: str) -> list[str]:
    """The lines a terminal shows, frame by frame: escape sequences gone, split at CR and LF."""
    return re.split(r"\r\n|\r|\n", ANSI.sub("", drawn))


def assert_fits(lines: list[str], columns: int = 80) -> None:
    for line in lines:
        assert cell_len(line) <= columns and "…" not in line, line


def test_the_bar_shows_every_step_when_refreshed():
    """ConsoleReporter.on_step driven by hand, a frame forced after each: no 10 Hz clock."""
    drawn = io.StringIO()
    console = Console(file=drawn, force_terminal=True, width=80, color_system=None)
    reporter = ConsoleReporter(console, Console(file=io.StringIO()))
    cfg = load_config(None, TINY)
    reporter.on_start(Started(Path("run"), cfg, SimpleNamespace(describe=lambda: "copy"),
                              torch.nn.Linear(2, 2), [], 0, torch.device("cpu"), ""))
    try:
        for step in range(1, 31):
            reporter.on_step(Stepped(step))
            reporter.progress.refresh()
            if step % 10 == 0:  # a train line: the figures change too
                reporter.on_train_line(TrainLine(step, 1 / step, 1000.0, 1e-3, 0.5, 1.0))
                reporter.progress.refresh()
    finally:
        reporter.stop("done", 30)
    lines = screen_lines(drawn.getvalue())
    assert_fits(lines)
    frames = [line for line in lines if FRAME.match(line)]
    assert {int(FRAME.match(line)[1]) for line in frames} >= set(range(1, 31))
    assert [int(FRAME.match(line)[2]) for line in frames] == [200] * len(frames)
    assert "loss 0.0333" in frames[-1] and frames[-1].rstrip().endswith("done")


@pytest.mark.slow  # starts minitfm processes
def test_the_bar_in_a_terminal_fits_80_columns_and_ends_with_why(tmp_path):
    """A real terminal: every frame fits, the last says why the run ended. (That the bar moves
    between train lines is test_the_bar_shows_every_step_when_refreshed's: here it would depend
    on rich's 10 Hz clock.)"""
    run_dir = "run"  # short, so that the commands to paste fit 80 columns too
    code, drawn = in_terminal(["train", *TINY, "log.log_every=50", "log.tensorboard=false",
                               "train.target_exact_match=null", "--run-dir", run_dir],
                              cwd=tmp_path)
    assert code == 0, drawn
    lines = screen_lines(drawn)
    assert_fits(lines)
    frames = [line for line in lines if FRAME.match(line)]
    assert FRAME.match(frames[-1])[1] == "200" and frames[-1].rstrip().endswith("done")
    assert "loss " in frames[-1] and "exact " in frames[-1]
    text = "\n".join(lines)
    assert "finished all 200 steps" in text and "Traceback" not in text
    assert "  minitfm eval run" in lines and "  minitfm visualize-attention run" in lines


@pytest.mark.slow  # starts minitfm processes
def test_an_early_stop_finishes_the_bar_and_says_so(tmp_path):
    code, drawn = in_terminal(["train", *TINY, "train.target_exact_match=0.05",
                               "log.tensorboard=false", "--run-dir", "run"], cwd=tmp_path)
    assert code == 0, drawn
    lines = screen_lines(drawn)
    assert_fits(lines)
    last = [line for line in lines if FRAME.match(line)][-1]
    assert last.startswith("step  50/200") and last.rstrip().endswith("target reached")
    assert "reached the 5% target at step 50 of 200" in lines


@pytest.mark.slow  # starts minitfm processes
def test_help_and_tables_fit_80_columns_in_a_terminal(tmp_path):
    for command in COMMANDS:
        code, drawn = in_terminal([command, "--help"])
        assert code == 0 and "Usage" in drawn, drawn
        assert_fits(screen_lines(drawn))
    code, drawn = in_terminal(["tasks"])
    assert code == 0 and "duplicate" in drawn
    assert_fits(screen_lines(drawn))


# --- piped: nothing is wrapped, whatever COLUMNS says ---

@pytest.fixture(scope="module")
def piped_run(tmp_path_factory):
    """A tiny run trained as `minitfm train ... > file` with COLUMNS=80 (stdout, stderr)."""
    run_dir = tmp_path_factory.mktemp("piped") / "a-run-directory-with-a-long-name" / "run"
    env = {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "minitfm", "train", *TINY,
                           "log.tensorboard=false", "--run-dir", str(run_dir)],
                          env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


@pytest.mark.slow  # starts minitfm processes
def test_piped_training_output_keeps_every_line_whole(piped_run):
    run_dir, stdout = piped_run
    lines = stdout.splitlines()
    start = [line for line in lines if line.startswith("task copy")]
    assert len(start) == 1 and start[0].endswith(", steps 0/200"), lines[:4]
    assert len(start[0]) > 80  # long enough that a wrap at 80 would have shown
    assert f"  minitfm visualize-attention {shown_path(run_dir)}" in lines
    assert any(line.startswith("finished all 200 steps") for line in lines)
    assert not any("━" in line for line in lines)  # no live bar in a file


@pytest.mark.slow  # starts minitfm processes
def test_piped_eval_keeps_its_title_and_caption_whole(piped_run, monkeypatch):
    run_dir, _ = piped_run
    monkeypatch.setenv("COLUMNS", "80")
    result = run_cli("eval", run_dir, "--samples", "50", "--max-len", "8")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    title = f"copy · {shown_path(run_dir / 'checkpoints' / 'best.pt')} · step 200"
    assert lines[0] == title and len(title) > 80
    caption = [line for line in lines if line.startswith("teacher-forced loss")]
    assert len(caption) == 1
    assert caption[0].endswith("trained on lengths 1..6; * outside the trained range")


def test_piped_bench_title_is_one_line(capsys):
    report = {"device": "cpu", "threads": 2, "load_average": 0.3, "cores": 2,
              "torch": "2.13.0", "peak_flops_per_s": 60.9e9,
              "throughput": [{"setup": "default", "minitfm_tokens_per_s": 1e4,
                              "torch_tokens_per_s": 1e4, "ratio": 1.0, "mfu": 0.2,
                              "book_tokens_per_s": 5e3, "book_ratio": 0.5}],
              "decoding": [], "eval": {"seconds": 0.3}, "memory": {"peak_rss_mb": 400.0}}
    for table in bench_tables(report):
        show(table)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("minitfm bench · cpu · 2 threads · load 0.3 on 2 cores · torch 2.13.0 · "
                     "matmul peak 60.9 GFLOP/s")


def test_a_title_breaks_at_its_separators_in_a_narrow_terminal():
    title = "minitfm bench · cpu · 2 threads · load 0.3 on 2 cores · torch 2.13.0 · " \
            "matmul peak 60.9 GFLOP/s"
    assert heading_lines(title, 80) == [
        "minitfm bench · cpu · 2 threads · load 0.3 on 2 cores · torch 2.13.0",
        "matmul peak 60.9 GFLOP/s"]
    assert heading_lines(title, 10_000) == [title]


# --- --help ---

@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_flags_as_flags_and_usage_as_written(command):
    result = run_cli(command, "--help")
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "<list[str]>" not in result.stdout
    assert "[[" not in result.stdout and "]]" not in result.stdout


def test_help_usage_and_choices(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # each help text on one line
    usages = {"train": "minitfm train [OPTIONS] [CONFIG] [KEY=VALUE]...",
              "eval": "minitfm eval [OPTIONS] [RUN]",
              "predict": "minitfm predict [OPTIONS] [RUN] [INPUT]...",
              "sweep": "minitfm sweep [OPTIONS] CONFIG [KEY=V1,V2,...]...",
              "runs": "minitfm runs [OPTIONS] [DIR]"}
    for command, usage in usages.items():
        assert usage in run_cli(command, "--help").stdout
    assert "best|last" in run_cli("eval", "--help").stdout
    viz = run_cli("visualize-attention", "--help").stdout
    assert "best|last" in viz and "encoder, decoder, cross or all" in viz
    assert "--version " in run_cli("--help").stdout


def test_each_commands_summary_is_reflowed_in_the_help_100_columns_wide(monkeypatch):
    """`minitfm --help` in a terminal 100 columns wide: each command's summary (its docstring's
    first paragraph) fills its column line by line; no line ends early where the docstring
    breaks one (newcomer #17: "its share in" / "restoring an answer under patching")."""
    monkeypatch.setenv("COLUMNS", "100")
    result = run_cli("--help")
    assert result.exit_code == 0
    panel = result.stdout.split("Commands", 1)[1].split("╰", 1)[0].splitlines()[1:]
    first = panel[0]
    start = len(first) - len(first[1:].lstrip().split(" ", 1)[1].lstrip())  # the help column
    width = first.rindex("│") - start - 1  # up to the padding before the border
    entries: list[list[str]] = []
    for line in panel:
        name, text = line[1:start].strip(), line[start:line.rindex("│")].strip()
        if name:
            entries.append([])
        entries[-1].append(text)
    assert [entry[0].split()[0] for entry in entries][:2] == ["Train", "Measure"]
    for entry in entries:
        for line, after in zip(entry, entry[1:]):
            assert len(line) + 1 + len(after.split()[0]) > width - 1, (line, after, width)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_own_help_is_reflowed_100_columns_wide(command, monkeypatch):
    """`minitfm COMMAND --help` 100 columns wide: each paragraph of its description fills the
    width line by line, as the terminal wraps it, not where the docstring breaks its lines."""
    monkeypatch.setenv("COLUMNS", "100")
    result = run_cli(command, "--help")
    assert result.exit_code == 0
    text = result.stdout.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[1:]
    plain = "\n".join(line.strip() for line in text)
    paragraphs = [p.strip().splitlines() for p in plain.split("\n\n") if p.strip()]
    assert paragraphs, result.stdout
    for lines in paragraphs:
        for line, after in zip(lines, lines[1:]):
            assert len(line) + 1 + len(after.split()[0]) > 100 - 3, (line, after)


def test_help_does_not_import_torch():
    code = ("import sys\nfrom minitfm.app.cli import app\n"
            f"for command in {COMMANDS!r} + [None]:\n"
            "    try:\n"
            "        app([command, '--help'] if command else ['--help'])\n"
            "    except SystemExit:\n"
            "        pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_only_the_face_imports_rich():
    # the reader sees lazy and relative imports (`from .rich import x` is no rich)
    assert {m for m, _ in read_imports("def f():\n    from rich.text import Text\n"
                                         "    from .rich import x\n", "minitfm.book")} == \
        {"rich.text", "minitfm.book.rich"}
    package = Path(minitfm.__file__).parent
    offenders = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
                 if path.relative_to(package).parts[0] != "app" and any(
                     name.split(".")[0] == "rich" for name in imported_modules(path))]
    assert offenders == []
    assert "rich.table" in imported_modules(package / "app" / "output.py")


# --- warnings and interruptions ---

def test_steps_below_warmup_warns_in_one_line(tmp_path):
    result = run_cli("train", *TINY, "train.steps=10", "train.warmup_steps=20",
                     "log.tensorboard=false", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    message = result.stderr.strip()
    assert message.startswith("warning: ") and "\n" not in message, message
    for needle in ("train.steps (10)", "train.warmup_steps (20)", "train.warmup_steps=1"):
        assert needle in message, (needle, message)


def test_no_warning_when_the_schedule_can_decay(tmp_path):
    result = run_cli("train", *TINY, "train.steps=30", "log.tensorboard=false",
                     "--run-dir", tmp_path / "run")
    assert result.exit_code == 0 and result.stderr == "", result.stderr


def test_ctrl_c_in_any_command_says_interrupted(capsys):
    @clean_errors(uses_torch=False)
    def command():
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, as the terminal sends it
        time.sleep(5)  # (the handler raises at once)

    with pytest.raises(typer.Exit) as stopped:
        command()
    assert stopped.value.exit_code == 130
    message = capsys.readouterr().err
    assert message.startswith("interrupted: Ctrl-C") and message.count("\n") == 1, message


def test_a_keyboard_interrupt_raised_by_code_is_not_called_ctrl_c(capsys):
    @clean_errors(uses_torch=False)
    def command():
        raise KeyboardInterrupt  # raised, no key pressed (a learner's code, say)

    with pytest.raises(typer.Exit) as stopped:
        command()
    assert stopped.value.exit_code == 1
    message = capsys.readouterr().err
    assert "Ctrl-C" not in message and "KeyboardInterrupt" in message, message
    assert message.startswith("error: ") and message.count("\n") == 1, message


@pytest.mark.parametrize("best, status, expected", [
    (0.995, "stopped at target", "reached the 99% target at step 250 of 300"),
    (1.0, "finished", "finished all 300 steps, reaching the 99% target"),
    (0.97, "finished", "finished all 300 steps (best exact match 97.0%, short of the 99% target)"),
    (0.5, "interrupted", "interrupted at step 250 of 300"),
])
def test_the_ending_says_why_the_run_ended(best, status, expected):
    from minitfm.app.progress import ending

    step = 300 if status == "finished" else 250
    summary = {"step": step, "steps": 300, "status": status, "best_exact_match": best}
    assert ending(summary, 0.99) == expected


# --- paths: one rule for every command ---

def test_a_path_is_shown_relative_to_the_current_folder_or_absolute_if_shorter(tmp_path,
                                                                              monkeypatch):
    from minitfm.errors import shown_path

    deep = tmp_path / "work" / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    here = Path.cwd()
    assert shown_path("runs/r/best.pt") == "runs/r/best.pt"
    assert shown_path(here / "runs" / "r") == "runs/r"  # a resolved path, inside
    assert shown_path("runs/../runs/r") == "runs/r"
    assert shown_path(here.parent / "other" / "r") == "../other/r"  # beside: shorter relative
    assert shown_path("/") == "/"  # not ../../..
    assert shown_path(".") == "."
    monkeypatch.chdir(deep)
    assert shown_path(here / "runs") == "../../runs"


@pytest.fixture(scope="module")
def path_run(tmp_path_factory):
    """A tiny run with its attention recorded, in <tmp>/work/runs/r."""
    from minitfm.app.api import train_run

    root = tmp_path_factory.mktemp("paths")
    recorded = [item for item in TINY if not item.startswith("log.attention_every")]
    train_run(load_config(None, [*recorded, "train.steps=50", "train.eval_every=25",
                                 "log.tensorboard=false"]), run_dir=root / "work" / "runs" / "r")
    return root


PATH_COMMANDS = {  # each command's options, and the start of the file it writes in the run
    "visualize-attention": (["--no-terminal", "--force"], "attention/best-step"),
    "over-training": (["--over-training", "--force"], "attention/over-training-layer0.png"),
    "ablate": (["--samples", "20", "--force"], "ablate/best-step"),
    "explore": ([], "explorer.html"),
    "plot": (["--force"], "plot.png"),
}


# Every command, three times (a second or more each): "beside" in the fast half, the others slow.
@pytest.mark.parametrize("where", [pytest.param("inside", marks=pytest.mark.slow), "beside",
                                   pytest.param("far", marks=pytest.mark.slow)])
def test_every_command_prints_its_paths_by_the_one_rule(path_run, monkeypatch, where):
    """The run given by its absolute path from the folder holding it, as `../work/runs/r` from
    a folder beside it, or from a folder so deep that the relative path is the longer: every
    path printed is relative to the current folder, or absolute where that is shorter.
    visualize-attention, ablate and explore printed absolute paths where --over-training and
    plot printed relative ones."""
    run = path_run / "work" / "runs" / "r"
    depth = len(str(run)) // 3 + 1  # `../` that many times is longer than the absolute path
    folder = {"inside": path_run / "work", "beside": path_run / "beside",
              "far": path_run.joinpath(*["d"] * depth)}[where]
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)
    given = {"inside": run, "beside": "../work/runs/r", "far": os.path.relpath(run)}[where]
    shown = {"inside": "runs/r", "beside": "../work/runs/r", "far": str(run)}[where]
    for command, (options, written) in PATH_COMMANDS.items():
        name = "visualize-attention" if command == "over-training" else command
        result = run_cli(name, given, *options)
        assert result.exit_code == 0, (command, result.stderr)
        lines = (result.stdout + result.stderr).splitlines()
        assert any(line.startswith(f"wrote {shown}/{written}") for line in lines), \
            (command, lines)
        others = str(path_run) if where != "far" else "../"
        assert not any(others in line for line in lines), (command, lines)
    result = run_cli("eval", given, "--samples", "20")
    assert f"copy · {shown}/checkpoints/best.pt · step" in result.stdout, result.stdout
