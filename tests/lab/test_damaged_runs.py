"""Damaged run directories, control characters in paths, and how `minitfm runs` says a run
ended (issue #29: the third adversarial report's M2, M3, L2, L5, L16; the test review's
untested promise #2).

A run directory can hold anything after a hand edit or a copy: one damaged run is listed as
`unreadable` with one `note:` line and never hides the others; `plot` and `--over-training`
refuse such a run in one line or skip the lines that hold no record.
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from minitfm.app.api import train_run
from minitfm.app.text import shell_quote
from minitfm.config import load_config
from minitfm.errors import CheckpointError, shown_path
from minitfm.lab.attention.timeline import ATTENTION_FILE, read_timeline
from minitfm.run.rundir import RunLock
from minitfm.run.summary import read_summary
from tests.helpers import TINY, assert_clean_error, run_cli
from tests.helpers import train_bare as train

REPO = Path(__file__).resolve().parents[2]
# 20 steps, evaluated (and attention recorded) at steps 10 and 20: about a second.
FAST = [*[item for item in TINY if not item.startswith("log.attention_every")],
        "train.steps=20", "train.eval_every=10", "train.eval_samples=50",
        "log.tensorboard=false", "log.attention_every=eval"]
ESC_NAME = "u\x1b[31mRED\x1b]0;PWNED\x07\nx"  # colour, a window title, BEL and a newline


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished tiny copy run with metrics and attention.jsonl, copied by the tests."""
    run_dir = tmp_path_factory.mktemp("damaged") / "base"
    train_run(load_config(None, FAST), run_dir=run_dir)
    return run_dir


def copy_runs(base: Path, root: Path, *names: str) -> list[Path]:
    return [Path(shutil.copytree(base, root / name)) for name in names]


def alias_bomb() -> str:
    """A config.yaml of a few hundred bytes whose aliases stand for 10^9 values."""
    lines = ["_bomb:", "  x0: &x0 [1,1,1,1,1,1,1,1,1,1]"]
    lines += [f"  x{i}: &x{i} [{','.join([f'*x{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join([*lines, "name: *x8", ""])


def listed(root: Path) -> tuple[dict, list[str]]:
    """`runs --json` rows by name, and the note lines on stderr; the table too, exit 0."""
    result = run_cli("runs", root, "--json")
    assert result.exit_code == 0, result.stderr
    table = run_cli("runs", root)
    assert table.exit_code == 0 and "Traceback" not in table.stdout + table.stderr
    assert table.stderr == result.stderr  # the same notes for both
    return {row["name"]: row for row in json.loads(result.stdout)}, result.stderr.splitlines()


# --- M2, M3: a damaged summary.json or config.yaml ---

DAMAGE = {
    "summary_list": ("summary.json", "[]", "summary.json holds a list"),
    "summary_empty_object": ("summary.json", "{}", "has no status minitfm writes (missing"),
    "summary_status_int": ("summary.json", '{"status": 5}', "(5; one of finished"),
    "summary_status_list": ("summary.json", '{"status": [1]}', "([1]; one of"),
    "summary_wall_text": ("summary.json", '{"status": "finished", "wall_s": "long"}',
                          "wall_s ('long') is not a number"),
    "summary_step_bool": ("summary.json", '{"status": "finished", "step": true}',
                          "step (True) is not an integer"),
    "summary_not_json": ("summary.json", "{status", "summary.json is not valid JSON"),
    "summary_deep": ("summary.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "summary_huge": ("summary.json", " " * 1_000_001, "larger than 1,000,000 bytes"),
    "config_list": ("config.yaml", "[1]\n", "config.yaml holds a list"),
    "config_empty": ("config.yaml", "", "config.yaml holds nothing"),
    "config_not_yaml": ("config.yaml", "a: [\n", "config.yaml is not valid YAML at line 2"),
    "config_alias_bomb": ("config.yaml", alias_bomb(), "expand to more than 10,000 values"),
    "config_section_int": ("config.yaml", "task: 5\n", "task (5) is not a mapping"),
    "config_task_name_list": ("config.yaml", "task: {name: [1]}\n", "task.name ([1])"),
    "config_not_utf8": ("config.yaml", b"task: {name: \xff}\n", "not UTF-8"),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_a_damaged_run_is_unreadable_with_a_note_and_the_others_are_listed(base, tmp_path,
                                                                           name):
    file, content, needle = DAMAGE[name]
    good, bad = copy_runs(base, tmp_path, "good", "bad")
    target = bad / file
    target.write_bytes(content if isinstance(content, bytes) else content.encode())
    rows, notes = listed(tmp_path)
    assert rows["good"]["status"] == "finished" and rows["good"]["task"] == "copy"
    assert "note" not in rows["good"]
    assert rows["bad"]["status"] == "unreadable" and needle in rows["bad"]["note"]
    assert notes == [f"note: run 'bad' is unreadable: {rows['bad']['note']}"]


def test_a_fifo_in_a_run_never_blocks_the_listing(base, tmp_path):
    good, bad = copy_runs(base, tmp_path, "good", "bad")
    for name in ("summary.json", ".lock"):
        (bad / name).unlink()
        os.mkfifo(bad / name)
    (good / "metrics.jsonl").unlink()
    os.mkfifo(good / "metrics.jsonl")  # read as no metrics: the summary says the rest
    rows, _ = listed(tmp_path)
    assert rows["bad"]["status"] == "unreadable"
    assert "summary.json is not a regular file" in rows["bad"]["note"]
    assert rows["good"]["status"] == "finished" and rows["good"]["step"] == 20


def test_runs_of_a_file_says_it_is_no_folder(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert_clean_error(run_cli("runs", tmp_path / "afile"), 2, "afile' is not a folder")
    assert_clean_error(run_cli("runs", tmp_path / "nope"), 2, "nope' not found")


def test_a_config_with_dates_and_tags_still_lists_as_json(base, tmp_path):
    """YAML reads `2026-01-01` as a date: `runs --json` writes it as text, not a traceback."""
    (run,) = copy_runs(base, tmp_path, "dated")
    with open(run / "config.yaml", "a") as f:
        f.write("notes: 2026-01-01\n")
    rows, notes = listed(tmp_path)
    assert rows["dated"]["changes"]["notes"] == "2026-01-01" and notes == []


# --- M2: metrics.jsonl lines that are no records ---

BAD_LINES = {
    "int": "5",
    "list": "[]",
    "text": '"step"',
    "step_text": '{"step": "x", "split": "eval", "loss": 1.0, "exact_match": 0.5}',
    "step_bool": '{"step": true, "split": "train", "loss": 1.0}',
    "exact_match_text": '{"step": 30, "split": "eval", "loss": 1.0, "exact_match": "high"}',
    "loss_missing": '{"step": 30, "split": "train"}',
    "split_unknown": '{"step": 30, "split": 5, "loss": 1.0}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "long": '{"step": 30, "split": "train", "loss": 1.0, "pad": "' + "x" * 70_000 + '"}',
    # numbers no run writes (M4, L4): a step past train.steps' limit, accuracies outside 0..1
    "step_401_digits": '{"step": 1' + "0" * 400 + ', "split": "train", "loss": 1.0}',
    "step_negative": '{"step": -1, "split": "train", "loss": 1.0}',
    "exact_7": '{"step": 30, "split": "gauges", "exact": 7.0, "loss": 1.0, '
               '"token_accuracy": 0.5}',
    "tokens_negative": '{"step": 30, "split": "gauges", "exact": 0.5, "loss": 1.0, '
                       '"token_accuracy": -5}',
    "exact_match_1.5": '{"step": 30, "split": "eval", "loss": 1.0, "exact_match": 1.5}',
}


@pytest.mark.parametrize("name", BAD_LINES)
def test_lines_that_hold_no_record_are_skipped_with_a_note(base, tmp_path, name):
    (run,) = copy_runs(base, tmp_path, "run")
    with open(run / "metrics.jsonl", "a") as f:
        f.write(BAD_LINES[name] + "\n")
    line = len((run / "metrics.jsonl").read_text().splitlines())
    rows, notes = listed(tmp_path)
    assert rows["run"]["status"] == "finished" and rows["run"]["step"] == 20
    assert notes == [f"note: run 'run': metrics.jsonl line {line} holds no record minitfm "
                     f"writes: skipped"]


def test_plot_skips_the_lines_that_hold_no_record_with_a_note(base, tmp_path):
    (run,) = copy_runs(base, tmp_path, "run")
    first = len((run / "metrics.jsonl").read_text().splitlines()) + 1
    with open(run / "metrics.jsonl", "a") as f:
        f.write("".join(line + "\n" for line in BAD_LINES.values()))
    plotted = run_cli("plot", run)
    assert plotted.exit_code == 0, plotted.stderr
    shown = ", ".join(str(first + n) for n in range(5))
    assert plotted.stderr == (f"note: run '{run}': metrics.jsonl lines {shown}, ... "
                              f"({len(BAD_LINES)}) hold no record minitfm writes: skipped\n")
    assert (run / "plot.png").is_file()


def test_a_torn_last_line_is_skipped_without_a_word(base, tmp_path):
    (run,) = copy_runs(base, tmp_path, "run")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "split": "tr')  # a run killed in the middle of a write
    rows, notes = listed(tmp_path)
    assert rows["run"]["step"] == 20 and notes == []


def test_plot_refuses_metrics_without_a_record_and_a_damaged_config_beside_others(base,
                                                                                tmp_path):
    only_bad, bomb, good = copy_runs(base, tmp_path, "only_bad", "bomb", "good")
    (only_bad / "metrics.jsonl").write_text('{"step": 1, "split": "train"}\n5\n')
    assert_clean_error(run_cli("plot", only_bad), 2, "has no metrics to plot",
                       "lines 1, 2 (2) hold no record")
    (bomb / "config.yaml").write_text(alias_bomb())
    out = tmp_path / "both.png"
    assert_clean_error(run_cli("plot", bomb, good, "--out", out), 2, "run '",
                       "10,000 values", "plot the run alone")
    assert not out.exists()
    assert run_cli("plot", bomb).exit_code == 0  # alone it needs no config for its label


# --- L5: hand-edited attention.jsonl ---

def test_a_deeply_nested_attention_line_is_skipped(base, tmp_path):
    (run,) = copy_runs(base, tmp_path, "run")
    with open(run / ATTENTION_FILE, "a") as f:
        f.write("[" * 200_000 + "]" * 200_000 + "\n")
    assert read_timeline(run).steps == [10, 20]
    (run / ATTENTION_FILE).write_text("[" * 200_000 + "]" * 200_000 + "\n")
    assert_clean_error(run_cli("visualize-attention", run, "--over-training"), 2,
                       "attention.jsonl' holds no record minitfm writes")


EDITS = {
    "exact_match": ("high", "exact_match 'high' of step 20 is not a number or null"),
    "step": (20.5, "step 20.5 is not an integer"),
    "input": (5, "input of step 20 is not text"),
    "source": ("abc", "source of step 20 is not a list of tokens"),
    "decoder_input": ([1, 2], "decoder_input of step 20 is not a list of tokens"),
}


@pytest.mark.parametrize("key", EDITS)
def test_hand_edited_attention_records_are_one_line(base, tmp_path, key):
    (run,) = copy_runs(base, tmp_path, "run")
    path = run / ATTENTION_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()]
    value, needle = EDITS[key]
    records[-1][key] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(CheckpointError, match="holds records minitfm did not write"):
        read_timeline(run)
    assert_clean_error(run_cli("visualize-attention", run, "--over-training"), 2,
                       "holds records minitfm did not write", needle)


# --- L2: control characters in paths never reach the terminal raw ---

@pytest.mark.parametrize("text", ["runs/plain-1", "runs/it's here", ESC_NAME, "a\\b\x7fc\x85",
                                  "runs/ünï'\x1b"])
def test_shell_quote_pastes_back_to_the_same_word(text):
    word = shell_quote(text)
    assert "\x1b" not in word and "\n" not in word
    echoed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True)
    assert echoed.stdout.decode("utf-8") == text


def test_paths_with_control_characters_print_escaped(tmp_path):
    """`train --run-dir` with ESC and a newline: the run directory line, the summary, the
    `next:` commands and the `runs` table show them escaped; nothing raw reaches stdout."""
    run_dir = tmp_path / "runs" / ESC_NAME
    result = run_cli("train", *FAST, "train.steps=2", "train.eval_every=0", "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    shown = shown_path(run_dir)
    shown = shown.replace("\x1b", "\\x1b").replace("\x07", "\\x07").replace("\n", "\\n")
    assert f"run directory: {shown}\n" in result.stdout
    assert shell_quote(shown_path(run_dir)) in result.stdout  # the next: commands, ready to paste
    for output in (result.stdout, run_cli("runs", tmp_path / "runs").stdout):
        assert not any(ch in output for ch in "\x1b\x07"), output
    assert "u\\x1b[31mRED" in run_cli("runs", tmp_path / "runs").stdout
    assert_clean_error(run_cli("plot", tmp_path / "nowhere\x1b[2J"), 2, "\\x1b[2J")


# --- the test review's promise #2: how `runs` says a real run ended ---

def test_runs_statuses_of_real_runs(base, tmp_path):
    """running (its lock held), failed (diverged, or killed before any checkpoint), paused,
    stopped at target and finished, each from a real tiny run."""
    root = tmp_path / "runs"
    (running,) = copy_runs(base, root, "running")
    diverged = run_cli("train", *FAST, "train.lr=1e6", "train.grad_clip=null",
                       "log.log_every=1", "--run-dir", root / "diverged")
    assert diverged.exit_code == 1 and "loss became nan" in diverged.stderr
    (killed,) = copy_runs(base, root, "killed")
    for leftover in ("summary.json", "checkpoints/last.pt", "checkpoints/best.pt"):
        (killed / leftover).unlink(missing_ok=True)
    train(load_config(None, FAST), run_dir=root / "paused", stop_at=10)
    target = run_cli("train", *FAST, "train.steps=200", "train.lr=0.01",
                     "train.warmup_steps=10", "train.target_exact_match=0.05",
                     "--run-dir", root / "target")
    assert target.exit_code == 0, target.stderr
    with RunLock(running):
        rows, notes = listed(root)
    assert {name: row["status"] for name, row in rows.items()} == {
        "running": "running", "diverged": "failed", "killed": "failed", "paused": "paused",
        "target": "stopped at target"}
    assert rows["paused"]["step"] == 10 and rows["target"]["step"] < 200 and notes == []
    assert read_summary(root / "diverged")["status"] == "failed"


def test_wall_time_adds_up_over_resumes(tmp_path):
    run_dir = tmp_path / "run"
    train(load_config(None, FAST), run_dir=run_dir, stop_at=10)
    summary = json.loads((run_dir / "summary.json").read_text())
    # As if the first session had taken a million seconds: only a sum can exceed that.
    (run_dir / "summary.json").write_text(json.dumps({**summary, "wall_s": 1e6}))
    result = run_cli("train", "--resume", run_dir)
    assert result.exit_code == 0, result.stderr
    total = read_summary(run_dir)["wall_s"]
    assert total > 1e6
    rows, _ = listed(tmp_path)
    assert rows["run"]["status"] == "finished" and rows["run"]["wall_s"] == total


# --- L16: a script beside the clone ---

@pytest.mark.slow
def test_the_api_imports_from_a_script_beside_the_clone(tmp_path):
    """A script whose folder holds the clone (`minitfm/` with runs/, tests/, configs/: no
    `__init__.py`) imports the package, not that folder as a namespace package. The install
    puts the clone's root on sys.path (pyproject's `package-dir`: a path entry in a .pth
    file): a regular package found on sys.path wins over a namespace folder of the same name.
    The script runs with no PYTHONPATH, so what it imports comes from the install alone."""
    import importlib.metadata

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "."}
    # the install's path entry: the clone it was made from (this one, or the one whose
    # virtual environment runs the tests), never an import hook
    # (the clone's own minitfm.egg-info, seen first from the repository root, lists no files:
    # the installed distribution is the one whose record holds the .pth)
    [pth] = [f for dist in importlib.metadata.distributions(name="minitfm")
             for f in dist.files or [] if f.name.endswith(".pth")]
    lines = [line.strip() for line in pth.locate().read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and not lines[0].startswith("import"), \
        (lines, "an import hook, not a path entry: run `make install` again")
    root = Path(lines[0])
    assert (root / "minitfm" / "__init__.py").is_file(), root
    clone = tmp_path / "minitfm"
    for folder in ("runs", "tests", "configs", "docs", "minitfm"):
        (clone / folder).mkdir(parents=True)
    script = tmp_path / "api.py"
    script.write_text("from minitfm import load_run, train\nimport minitfm.lab.many.runs as runs\n"
                      "print(load_run.__module__, train.__module__, runs.__file__)\n")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["minitfm.app.api", "minitfm.app.api",
                                   str(root / "minitfm" / "lab" / "many" / "runs.py")]
