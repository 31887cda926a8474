"""Hostile files in and around a run (the fourth adversarial report, 2026-11-25: H1, H2, L2, L3,
M2, L10, M9, M10, L11, M3; and a checkpoint of junk bytes).

minitfm opens a run's files one way (`run.rundir.open_run_file`): never through a symbolic link,
and only a regular file, so a link planted in a shared run folder cannot make it write into a
file of yours, and a FIFO cannot hang it. It removes only regular files it made, never through
a linked folder. A damaged result is done again, an unreadable run is listed as such, a name
that is not UTF-8 is shown escaped, and a SIGTERM mid-write leaves no temp file. Each test names
the report's case (`LK_lock`, ...).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minitfm.app.api import train_run
from minitfm.app.text import printable, shell_quote
from minitfm.config import load_config
from minitfm.run.rundir import NotRegularFile, open_run_file
from tests.helpers import TINY, assert_clean_error, given_once, run_cli

# 20 steps, evaluated (and attention recorded) at steps 10 and 20: about a second.
FAST = [*[item for item in TINY if not item.startswith("log.attention_every")],
        "train.steps=20", "train.eval_every=10", "train.eval_samples=50",
        "log.tensorboard=false"]
SWEEP = [*FAST, "train.eval_every=0"]  # a sweep evaluates each run itself
OTHER_UID = 23457  # the report's other local user
IS_ROOT = os.geteuid() == 0
PRECIOUS = b"victim's precious notes\n"
NOT_UTF8 = "r\udce9sultat"  # the bytes b"r\xe9sultat": a Latin-1 name, as Python holds it
# Root reads every file: these take that away, so that root sees what another user would.
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture(autouse=True)
def sigterm_as_it_was():
    """The CLI run in-process sets SIGTERM's handler (see `run.signals.started`): put it back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished tiny copy run with metrics and attention.jsonl, copied by the tests."""
    run_dir = tmp_path_factory.mktemp("hostile") / "base"
    train_run(load_config(None, FAST), run_dir=run_dir)
    return run_dir


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of the user's, private, that a planted link points at."""
    path = tmp_path / "victim" / "notes.txt"
    path.parent.mkdir()
    path.write_bytes(PRECIOUS)
    path.chmod(0o600)
    return path


def copy_run(base: Path, where: Path) -> Path:
    return Path(shutil.copytree(base, where))


def plant_link(path: Path, target: Path) -> None:
    """`path` (removed first) as a symbolic link to `target`."""
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def minitfm(*args, prefix: tuple = (), env: dict | None = None,
            timeout: int = 120) -> subprocess.CompletedProcess:
    """A real `python -m minitfm` process (one thread), for what CliRunner cannot show."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([*prefix, sys.executable, "-m", "minitfm", *given_once(args)],
                          env=env, capture_output=True, timeout=timeout)


def as_another_user() -> tuple:
    """What to put before a command so that it cannot read files that are not its own: for
    root, setpriv without the capabilities to read others' files; for anyone else, nothing."""
    if not IS_ROOT:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("root reads every file, and setpriv (util-linux), which can take that "
                    "away, is not installed")
    return tuple(NO_OVERRIDE)


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The process ended with `code` and one `error:` line holding `needles`."""
    stderr = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == code, (proc.returncode, stderr[-2000:])
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr[-2000:]
    for needle in needles:
        assert needle in stderr, (needle, stderr)
    return stderr


# --- H1: files a run writes in place are never opened through a link ---

IN_PLACE = {"LK_lock": ".lock", "LK_jsonl_metrics": "metrics.jsonl",
            "LK_jsonl_attention": "attention.jsonl"}


@pytest.mark.parametrize("how", ["--resume", "--overwrite"])
@pytest.mark.parametrize("case", IN_PLACE)
def test_a_linked_file_written_in_place_is_refused_and_its_target_kept(base, tmp_path, victim,
                                                                       case, how):
    run = copy_run(base, tmp_path / "lk")
    plant_link(run / IN_PLACE[case], victim)
    again = ["--resume", run] if how == "--resume" else [*FAST, "--run-dir", run, how]
    result = run_cli("train", *again, "train.steps=22", "log.attention_every=1")
    assert_clean_error(result, 2, IN_PLACE[case], "symbolic link", "remove it")
    assert victim.read_bytes() == PRECIOUS
    assert (run / IN_PLACE[case]).is_symlink()  # not removed either: it is no file minitfm made


@pytest.mark.parametrize("name", IN_PLACE.values())
def test_a_fifo_written_in_place_is_refused_before_it_can_hang_training(base, tmp_path, name):
    run = copy_run(base, tmp_path / "ff")
    (run / name).unlink()
    os.mkfifo(run / name)  # an append would wait for a reader forever
    result = run_cli("train", "--resume", run, "train.steps=22", "log.attention_every=1")
    assert_clean_error(result, 2, name, "is not a regular file (a FIFO)")


def test_a_lock_linked_by_another_user_in_a_shared_run_folder_is_refused(base, tmp_path,
                                                                        victim):
    """LK_lock_other_uid: a run folder others may write into (a shared project's), where
    another user replaced `.lock` with a link to the victim's private file."""
    run = copy_run(base, tmp_path / "shared")
    run.chmod(0o777)
    plant_link(run / ".lock", victim)
    if IS_ROOT:  # the link is the other user's (elsewhere the test plants it as itself)
        os.lchown(run / ".lock", OTHER_UID, OTHER_UID)
    result = run_cli("train", "--resume", run, "train.steps=22")
    assert_clean_error(result, 2, ".lock", "symbolic link")
    assert victim.read_bytes() == PRECIOUS


@pytest.mark.parametrize("name", [".lock", "run.log"])
def test_a_sweep_never_writes_through_a_linked_lock_or_log(tmp_path, victim, name):
    """LK_sweep_lock, and the job's log the sweep appends to."""
    out = tmp_path / "sw"
    out.mkdir()
    plant_link(out / name, victim)
    result = run_cli("sweep", *SWEEP, "seed=0", "--out", out, "--eval-samples", "20")
    assert_clean_error(result, 2, name, "symbolic link")
    assert victim.read_bytes() == PRECIOUS and not (out / "run").exists()


@pytest.mark.parametrize("mode", ["rb", "r", "a", "a+"])
def test_open_run_file_refuses_a_link_a_fifo_and_a_folder(tmp_path, victim, mode):
    plant_link(tmp_path / "link", victim)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    for name, what in [("link", "is a symbolic link"), ("fifo", "(a FIFO)"),
                       ("folder", "(a folder)")]:
        with pytest.raises(NotRegularFile) as caught:
            open_run_file(tmp_path / name, mode)
        assert what in caught.value.strerror
    assert victim.read_bytes() == PRECIOUS
    (tmp_path / "file").write_bytes(b"x")
    with open_run_file(tmp_path / "file", mode) as f:
        assert f.read() in ("x", b"x") if mode.startswith("r") else f.writable()


# --- H2: --overwrite never deletes through a linked checkpoints/ ---

def test_overwrite_never_deletes_through_a_linked_checkpoints_folder(base, tmp_path):
    """LK_ckpt_overwrite: checkpoints kept on another disk, a folder of other models."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "resnet50.pt").write_text("weights of another project")
    (models / "bert.pt").write_text("x")
    run = tmp_path / "lkc"
    run.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(base / name, run / name)
    (run / "checkpoints").symlink_to(models)
    result = run_cli("train", *FAST, "--run-dir", run, "--overwrite")
    assert_clean_error(result, 2, "checkpoints", "symbolic link", "--overwrite")
    assert sorted(p.name for p in models.iterdir()) == ["bert.pt", "resnet50.pt"]
    assert (models / "resnet50.pt").read_text() == "weights of another project"
    assert (run / "metrics.jsonl").read_bytes() == (base / "metrics.jsonl").read_bytes()


def test_a_resume_leaves_others_temp_files_behind_a_linked_checkpoints_folder(base, tmp_path):
    """The run's stale temp files are cleared at each start, but never through a link: there
    they may be another process's writes in progress."""
    disk = tmp_path / "disk" / "checkpoints"
    shutil.copytree(base / "checkpoints", disk)
    (disk / ".other.pt.tmp").write_text("another process's write in progress")
    run = copy_run(base, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(disk)
    result = run_cli("train", "--resume", run, "--run-dir", run, "train.steps=22")
    assert result.exit_code == 0, result.stderr
    assert (disk / ".other.pt.tmp").read_text() == "another process's write in progress"


# --- L3: --overwrite removes the old run's explorer page ---

def test_overwrite_removes_the_old_runs_explorer_page(base, tmp_path):
    """EX_overwrite_stale: the page of another model must not stay beside the new run."""
    run = copy_run(base, tmp_path / "ow")
    assert run_cli("explore", run).exit_code == 0 and (run / "explorer.html").is_file()
    (run / "mine.html").write_text("a page of mine")
    result = run_cli("train", *FAST, "--run-dir", run, "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert not (run / "explorer.html").exists()
    assert (run / "mine.html").read_text() == "a page of mine"


# --- L2: a SIGTERM during a picture's or a page's write leaves no temp file ---

# Put on the child's PYTHONPATH as `sitecustomize`: it sends the process a SIGTERM the moment
# the temp file of $TERM_DURING is written and about to be synced, the middle of the write.
TERM_HOOK = """
import os, signal

real_fsync = os.fsync

def fsync(fd):
    if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(os.environ["TERM_DURING"]):
        os.kill(os.getpid(), signal.SIGTERM)
    return real_fsync(fd)

os.fsync = fsync
"""


@pytest.mark.slow
@pytest.mark.parametrize("command,made", [("plot", "plot.png"), ("explore", "explorer.html")])
def test_a_sigterm_during_a_write_leaves_no_temp_file(base, tmp_path, command, made):
    """EX_sigterm_write: SIGTERM is Ctrl-C's twin: the write is undone, one line, 143."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(TERM_HOOK)
    run = copy_run(base, tmp_path / "run")
    path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = minitfm(command, run, env={"PYTHONPATH": path, "TERM_DURING": f".{made}."})
    stderr = proc.stderr.decode()
    assert proc.returncode == 143, (proc.returncode, stderr[-2000:])
    assert stderr == "interrupted: SIGTERM: the command did not finish\n"
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    assert not (run / made).exists()


# --- M2, L10, M9: a sweep's eval-*.json that is damaged, empty or no file ---

DAMAGED_EVAL = {
    "SW_evaljson_list": "[1]",
    "SW_evaljson_str": '{"exact_match": "x", "per_length": {}}',
    "SW_evaljson_nan": '{"exact_match": NaN, "per_length": {"3": {"exact_match": NaN, '
                       '"count": 3}}}',
    "SW_evaljson_empty": "{}",
    "SW_evaljson_no_lengths": '{"exact_match": 0.5}',
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A finished one-run sweep, copied by the tests."""
    out = tmp_path_factory.mktemp("swept") / "sw"
    result = run_cli("sweep", *SWEEP, "seed=0", "--out", out, "--eval-samples", "20")
    assert result.exit_code == 0, result.stdout + result.stderr
    return out


def damaged_sweep(swept: Path, where: Path, damage) -> tuple[Path, Path]:
    """A copy of the sweep whose run's eval-1-6.json is replaced by `damage(path)`."""
    out = Path(shutil.copytree(swept, where / "sw"))
    report = out / "run" / "eval-1-6.json"
    report.unlink()
    damage(report)
    return out, report


def assert_evaluated_again(result, out: Path, report: Path) -> None:
    """The sweep ended well, with the run evaluated anew and counted once, by its new report."""
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert report.is_file() and not report.is_symlink()
    fresh = json.loads(report.read_text())
    assert 0.0 <= fresh["exact_match"] <= 1.0 and fresh["per_length"]
    rows = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert [row["exact_match"]["1..6"] for row in rows] == [fresh["exact_match"]]


@pytest.mark.slow
@pytest.mark.parametrize("case", DAMAGED_EVAL)
def test_a_damaged_evaluation_is_done_again_and_never_counted(swept, tmp_path, case):
    out, report = damaged_sweep(swept, tmp_path,
                                lambda path: path.write_text(DAMAGED_EVAL[case]))
    result = minitfm("sweep", *SWEEP, "seed=0", "--out", out, "--eval-samples", "20")
    assert_evaluated_again(result, out, report)
    assert b"1 runs (0 already done)" in result.stdout


@pytest.mark.slow
def test_a_fifo_named_like_an_evaluation_never_hangs_a_sweep(swept, tmp_path):
    """SW_fifo_eval."""
    out, report = damaged_sweep(swept, tmp_path, os.mkfifo)
    result = minitfm("sweep", *SWEEP, "seed=0", "--out", out, "--eval-samples", "20",
                     timeout=120)
    assert_evaluated_again(result, out, report)


@pytest.mark.slow
@pytest.mark.parametrize("case,fifo", [("EX_fifo_eval", "eval-1-16.json"),
                                        ("EX_fifo_ablate", "ablate/x-step1-zero.png")])
def test_a_fifo_named_like_a_run_file_never_hangs_explore(base, tmp_path, case, fifo):
    run = copy_run(base, tmp_path / "ff")
    (run / fifo).parent.mkdir(exist_ok=True)
    os.mkfifo(run / fifo)
    proc = minitfm("explore", run, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert (run / "explorer.html").is_file()


# --- M10, L11: what another user cannot read ---

@pytest.mark.slow
def test_an_unreadable_run_directory_is_listed_as_such_beside_the_others(base, tmp_path):
    """RU_dir000: a colleague's private run in a shared runs/ folder."""
    prefix = as_another_user()
    runs = tmp_path / "runs"
    for name in "abc":
        copy_run(base, runs / name)
    (runs / "b").chmod(0o000)
    try:
        proc = minitfm("runs", runs, "--json", prefix=prefix)
        table = minitfm("runs", runs, prefix=prefix)
    finally:
        (runs / "b").chmod(0o755)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert [rows[name]["status"] for name in "abc"] == ["finished", "unreadable", "finished"]
    assert "cannot read" in rows["b"]["note"] and "Permission denied" in rows["b"]["note"]
    assert proc.stderr.decode() == f"note: run 'b' is unreadable: {rows['b']['note']}\n"
    assert table.returncode == 0 and b"unreadable" in table.stdout


@pytest.mark.slow
def test_plot_of_unreadable_metrics_says_it_cannot_read_them(base, tmp_path):
    """RU_plot_metrics000: not "no metrics yet ... train it first"."""
    prefix = as_another_user()
    run = copy_run(base, tmp_path / "b")
    (run / "metrics.jsonl").chmod(0o000)
    proc = minitfm("plot", run, prefix=prefix)
    one_line(proc, 2, "cannot read", "metrics.jsonl", "Permission denied")
    assert b"train it first" not in proc.stderr and not (run / "plot.png").exists()


def test_plot_of_metrics_that_are_no_file_says_so(base, tmp_path):
    run = copy_run(base, tmp_path / "b")
    plant_link(run / "metrics.jsonl", base / "metrics.jsonl")
    assert_clean_error(run_cli("plot", run), 2, "metrics.jsonl", "symbolic link")
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    assert_clean_error(run_cli("plot", run), 2, "metrics.jsonl", "not a regular file")


# --- M3: run paths that are not UTF-8 ---

@pytest.mark.parametrize("case", ["NU_train_rundir", "NU_logdir"])
def test_tensorboard_under_a_path_that_is_not_utf8_is_refused_before_writing(tmp_path,
                                                                             case):
    where = tmp_path / NOT_UTF8
    args = ["--run-dir", where] if case == "NU_train_rundir" else [f"log.dir={where}"]
    result = run_cli("train", *FAST, "log.tensorboard=true", *args)
    assert_clean_error(result, 2, "not UTF-8", "log.tensorboard=false")
    assert not where.exists()


def test_training_without_tensorboard_under_such_a_path_works(tmp_path):
    """NU_train_tb_off: a name TensorBoard alone cannot take."""
    result = run_cli("train", *FAST, "--run-dir", tmp_path / NOT_UTF8)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / NOT_UTF8 / "checkpoints" / "best.pt").is_file()


@pytest.fixture(scope="module")
def latin1_run(base, tmp_path_factory) -> Path:
    """The base run copied under a folder whose name is not UTF-8."""
    return copy_run(base, tmp_path_factory.mktemp("latin1") / NOT_UTF8)


@pytest.mark.parametrize("case,args,made", [
    ("NU_plot", ["plot"], "plot.png"),
    ("NU_eval_plot", ["eval", "--samples", "20", "--plot", "{run}/e.png"], "e.png"),
    ("EX_nonutf8", ["explore"], "explorer.html"),
])
def test_commands_draw_a_run_whose_name_is_not_utf8(latin1_run, case, args, made):
    args = [arg.format(run=latin1_run) for arg in args]
    result = run_cli(args[0], latin1_run, *args[1:])
    assert result.exit_code == 0, result.stderr
    assert (latin1_run / made).is_file()


def test_a_name_that_is_not_utf8_is_quoted_to_paste_back_to_the_same_path():
    """The `next:` commands: bash's $'\\xe9' is the byte the name holds."""
    quoted = shell_quote(NOT_UTF8)
    assert quoted == "$'r\\xe9sultat'" and printable(NOT_UTF8) == "r\\xe9sultat"
    pasted = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True)
    assert pasted.stdout == os.fsencode(NOT_UTF8)


@pytest.mark.slow
@pytest.mark.parametrize("case,args", [("NU_runs_strict", ["runs", "{parent}"]),
                                       ("NU_eval_strict", ["eval", "{run}", "--samples", "20"])])
def test_a_strict_utf8_terminal_shows_such_a_name_escaped(latin1_run, case, args):
    args = [arg.format(run=latin1_run, parent=latin1_run.parent) for arg in args]
    proc = minitfm(*args, env={"PYTHONIOENCODING": "utf-8:strict"})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert b"r\\xe9sultat" in proc.stdout


# --- a checkpoint of junk bytes ---

JUNK = {  # what torch.load raised on each, before
    "struct.error": b"\x80\x02G\x00\x01",
    "KeyError": b"\x80\x02h\x05",
    "IndexError": b"\x80\x02q\x00",
    "TypeError": b"\x80\x02}(}K\x01u",
    "IndexError_one_byte": b"\x80",
}


@pytest.mark.parametrize("case", JUNK)
def test_a_checkpoint_of_junk_bytes_is_one_line(tmp_path, case):
    (tmp_path / "junk.pt").write_bytes(JUNK[case])
    result = run_cli("eval", tmp_path / "junk.pt")
    assert_clean_error(result, 2, "junk.pt' is corrupt", "use the other checkpoint")
