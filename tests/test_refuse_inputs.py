"""Hostile, oversized and broken inputs from the adversarial report (shared/reports/
adversarial-2026-11-22.md): refused in one line, nothing written, nothing lost.

Each test names its report case (H2, M1, L5, ...). The checkpoint-side cases live in
tests/run/test_refuse_checkpoints.py.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minitfm.config import load_config
from minitfm.errors import ConfigError, Interrupted
from minitfm.run.checkpoint import load_checkpoint
from tests.helpers import TINY, assert_clean_error, given_once, once, run_cli

SHORT = [*TINY, "train.steps=20", "train.eval_every=0", "log.tensorboard=false"]


def minitfm(*args, stdin=None, preexec_fn=None, shell_suffix: str | None = None,
            timeout: int = 120) -> subprocess.CompletedProcess:
    """A real `python -m minitfm` process (one thread), for what CliRunner cannot show."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "minitfm", *given_once(args)]
    if shell_suffix is not None:  # redirections such as `<&-` or `| head -1`
        import shlex
        command = ["bash", "-c", f"{shlex.join(command)} {shell_suffix}"]
    return subprocess.run(command, env=env, text=True, capture_output=True, stdin=stdin,
                          preexec_fn=preexec_fn, timeout=timeout)


def assert_one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    message = proc.stderr.strip()
    assert message.startswith("error: ") and "\n" not in message, message[-2000:]
    for needle in needles:
        assert needle in message, (needle, message)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished tiny reverse-free copy run (20 steps) to eval, predict and visualize."""
    run_dir = tmp_path_factory.mktemp("refuse") / "base"
    result = run_cli("train", *SHORT, "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    return run_dir


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- H2: YAML alias bombs, and no unbounded repr of user input ---

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("tail", ["train: {steps: *i}\n", "name: *h\n"])
def test_alias_bomb_is_refused_at_once(empty_cwd, tail):
    (empty_cwd / "laughs.yaml").write_text(LAUGHS + tail)
    result = run_cli("train", "laughs.yaml")
    assert_clean_error(result, 2, "aliases", "expand to more than")
    assert len(result.stderr) < 300 and list(empty_cwd.iterdir()) == [empty_cwd / "laughs.yaml"]


@pytest.mark.parametrize("text", ["train: " + "[" * 20000 + "]" * 20000,
                                  "a: " + "{b: " * 3000 + "1" + "}" * 3000])
def test_deep_nesting_is_refused(tmp_path, text):
    (tmp_path / "deep.yaml").write_text(text)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(tmp_path / "deep.yaml")


def test_a_few_aliases_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("train: &t {steps: 7, lr: 1e-3}\nlog: {log_every: 7}\n")
    cfg = load_config(path)
    assert cfg.train.steps == 7 and cfg.train.lr == 1e-3 and cfg.log.log_every == 7


def test_long_values_are_cut_in_messages(empty_cwd):
    result = run_cli("train", "--print-config", "name=" + "n" * 5000)
    assert_clean_error(result, 2, "name (")
    assert len(result.stderr) < 300


@pytest.mark.parametrize("overrides,needles", [
    (["model.d_model=10", "model.n_heads=4"],
     ["model.d_model (10) must be divisible by model.n_heads (4)"]),
    (["model.dropout=1.0"], ["model.dropout (1.0)"]),
    (["model.positional=rotary"],
     ["model.positional ('rotary') must be one of", "did you mean 'rope'"]),
    (["model.code=slow"], ["model.code (", "slow')", "neither fast nor book"]),
])
def test_model_values_the_book_asserts_are_refused_in_one_line(empty_cwd, overrides, needles):
    """The book's layers only assert their own invariants; the config refuses a user's values
    first, naming the key."""
    assert_clean_error(run_cli("train", *SHORT, *overrides), 2, *needles)


# --- M1: sizes that cannot fit are refused before anything is written ---

@pytest.fixture
def machine_with_16_gb(monkeypatch):
    """A machine with 16 GB to spare, whatever this one has (a GPU machine had 128 GB, where a
    batch of a million sequences fits and the test trained it instead)."""
    from minitfm.run import limits

    monkeypatch.setattr(limits, "available_bytes", lambda: 16 * 10**9)


@pytest.mark.parametrize("override,needle", [
    ("model.d_model=1000000", "model.d_model (1000000): input should be less than or equal"),
    ("model.d_model=60000", "model.d_model (60000) needs ~"),
    ("train.batch_size=1000000000", "train.batch_size (1000000000): input should be less"),
    ("train.batch_size=1000000", "train.batch_size (1000000) needs ~"),
    ("task.max_len=60000", "task.max_len (60000) needs ~"),
    ("task.max_len=100000", "task.max_len (100000): input should be less than or equal"),
    ("model.max_len=1000000000", "model.max_len (1000000000): input should be less"),
    ("task.n_symbols=1000000000", "task.n_symbols (1000000000): input should be less"),
    ("train.eval_samples=1000000000", "train.eval_samples (1000000000): input should be less"),
])
def test_oversized_configs_are_refused_before_writing(empty_cwd, machine_with_16_gb, override,
                                                      needle):
    result = run_cli("train", *SHORT, override)
    assert_clean_error(result, 2, needle)
    assert not (empty_cwd / "runs").exists()


def test_the_memory_estimate_is_not_far_above_the_truth():
    from minitfm.run.limits import training_parts

    # reverse with task.max_len=300 peaked at 2.7 GB (RSS): the estimate must not refuse it
    # on a machine with 8 GB to spare (adversarial re-run, N1).
    cfg = load_config(None, ["task.max_len=300"])
    assert 2e9 < sum(size for _, _, size in training_parts(cfg)) < 5e9


# One training step in a fresh process: its estimate, and the memory (RSS) the step added to
# what the imports had made resident, from the process's own high-water mark (VmHWM).
MEASURE_RUN = """
import json, sys, tempfile
from pathlib import Path
from minitfm.config import load_config
from minitfm.run.limits import training_parts
from minitfm.run.session import RunOptions, start_training
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
cfg = load_config(None, sys.argv[1:])
estimate = sum(size for _, _, size in training_parts(cfg))
before = status("VmRSS:")
with tempfile.TemporaryDirectory() as tmp:
    start_training(cfg, RunOptions(run_dir=Path(tmp) / "run"))
print(json.dumps({"estimate": estimate, "used": status("VmHWM:") - before}))
"""


@pytest.mark.slow  # starts torch processes
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_the_memory_estimate_is_within_twice_the_measured_peak():
    # Two kinds of memory: attention maps that grow with the square of the length, and a
    # model's weights with AdamW's copies. A memory figure, not a timing: measured together.
    configs = [["task.max_len=100", "train.batch_size=32"],
               ["model.d_model=256", "model.d_ff=1024", "task.max_len=16"]]
    common = ["train.steps=1", "train.eval_every=0", "train.eval_samples=16",
              "log.tensorboard=false", "threads=1", "device=cpu"]  # host memory: a CPU run
    procs = [subprocess.Popen([sys.executable, "-c", MEASURE_RUN, *config, *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for config in configs]
    for config, proc in zip(configs, procs, strict=True):
        out, err = proc.communicate()
        assert proc.returncode == 0, err[-2000:]
        figures = json.loads(out.splitlines()[-1])
        assert figures["estimate"] > 100 * 2**20, config  # large enough to stand out
        assert figures["estimate"] / 2 <= figures["used"] <= 2 * figures["estimate"], \
            (config, figures)


@pytest.mark.parametrize("args,needle", [  # L14
    (["task.name=add", "task.n_symbols=11"], "task.n_symbols (11)"),
    (["train.batch_size=1000000"], "train.batch_size (1000000) needs ~"),
])
def test_print_config_refuses_what_train_refuses(empty_cwd, machine_with_16_gb, args, needle):
    trained = run_cli("train", *SHORT, *args)
    assert_clean_error(trained, 2, needle)
    printed = run_cli("train", "--print-config", *SHORT, *args)
    assert_clean_error(printed, 2, needle)
    assert printed.stderr == trained.stderr and printed.stdout == ""  # the same one line
    assert not (empty_cwd / "runs").exists()


@pytest.mark.parametrize("args,needle", [
    (["--samples", "1000000000"], "--samples"),
    (["--samples", "2", "--min-len", "100000", "--max-len", "100000"], "--min-len"),
    (["--samples", "2", "--min-len", "60000", "--max-len", "60000"], "--max-len (60000) needs ~"),
    (["--samples", "10", "--seed", "99999999999999999999999"], "--seed"),  # M3
])
def test_eval_sizes_are_refused(run, args, needle):
    assert_clean_error(run_cli("eval", run, *args), 2, needle)


def test_visualize_refuses_an_input_too_long_to_draw(run, tmp_path):
    result = run_cli("visualize-attention", run, "--input", "1" * 1200, "--no-terminal",
                     "--out", tmp_path / "x.png")
    assert_clean_error(result, 2, "more than the 64 allowed")
    assert not (tmp_path / "x.png").exists()


def test_running_out_of_memory_is_one_line(monkeypatch, run):
    def allocate(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                           "allocate memory: you tried to allocate 8000000000 bytes.")

    monkeypatch.setattr("minitfm.lab.measure.evaluate.eval_report", allocate)
    assert_clean_error(run_cli("eval", run), 1, "out of memory")


# --- M2: long inputs decode without rebuilding caches at every step ---

def test_caches_past_max_len_grow_by_doubling():
    from minitfm.book.model import Seq2SeqTransformer

    cfg = load_config(None, ["model.max_len=8"]).model
    model = Seq2SeqTransformer(cfg, 14, 0)
    model.subsequent(8, 1)  # row 8: one past the cache
    assert model.causal_mask.shape == (16, 16)
    model.subsequent(9, 1)  # no rebuild for the next row
    assert model.causal_mask.shape == (16, 16)
    model.positional(torch.zeros(1, 9, cfg.d_model))  # (B, T, D), one past the table
    table = model.positional.table
    assert table.size(0) == 16
    model.positional(torch.zeros(1, 10, cfg.d_model))
    assert model.positional.table is table


def test_predict_decodes_a_long_input(run):
    result = run_cli("predict", run, " ".join("01234" * 100))  # 500 tokens, past max_len 256
    assert result.exit_code == 0, result.stderr
    # README: one output line, and one `warning:` line saying how many and the longest
    output = result.stdout.splitlines()
    assert len(output) == 1 and output[0].strip(), result.stdout[-300:]
    assert set(output[0].split()) <= set("01234")  # tokens of the task, written as the input
    assert result.stderr.splitlines() == [
        "warning: 1 input is longer than the lengths trained on (1..6; the longest has 500): "
        "expect mistakes"]


# --- M3, M7, L5: seeds, infinities and YAML 1.1 coercions ---

@pytest.mark.parametrize("override,needle", [
    ("seed=99999999999999999999999", "seed (99999999999999999999999)"),
    ("task.eval_seed=99999999999999999999999", "task.eval_seed"),
    ("train.lr=.inf", "train.lr (inf): input should be a finite number"),
    ("train.weight_decay=.inf", "train.weight_decay (inf)"),
    ("train.grad_clip=.inf", "train.grad_clip (inf)"),
    ("train.label_smoothing=.nan", "train.label_smoothing (nan)"),
    ("train.steps=true", "train.steps (True): input should be a valid integer"),
    ("model.norm_first=1", "model.norm_first (1): input should be a valid boolean"),
    ("train.steps=1e3", "train.steps (1000.0)"),
])
def test_bad_values_are_refused_before_writing(empty_cwd, override, needle):
    assert_clean_error(run_cli("train", *SHORT, override), 2, needle)
    assert not (empty_cwd / "runs").exists()


@pytest.mark.parametrize("override,key,value", [
    ("train.steps=017", ("train", "steps"), 17),  # decimal, not YAML 1.1's octal 15
    ("train.steps=0x10", ("train", "steps"), 16),
    ("train.lr=3e-4", ("train", "lr"), 3e-4),
    ("name=2024", ("name",), "2024"),  # text keys take the text as written
    ("name=on", ("name",), "on"),
    ("name=1.5", ("name",), "1.5"),
    ('name="2024"', ("name",), "2024"),  # YAML's quotes still work (report case Q04)
])
def test_overrides_read_as_written(override, key, value):
    cfg = load_config(None, [override])
    for part in key:
        cfg = getattr(cfg, part)
    assert cfg == value and type(cfg) is type(value)


# --- L6, L7, L15, L17: config files ---

@pytest.mark.parametrize("text,needle", [
    ("train:\n  steps: 5\n  steps: 7\n", "line 3: duplicate key 'steps'"),
    ("train:\n  steps: 5\ntrain:\n  lr: 0.1\n", "line 3: duplicate key 'train'"),
])
def test_duplicate_keys_are_refused(tmp_path, text, needle):
    (tmp_path / "dup.yaml").write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(tmp_path / "dup.yaml")


def test_a_numeric_name_in_a_file_is_text(tmp_path):
    (tmp_path / "n.yaml").write_text("name: 2024\n")
    assert load_config(tmp_path / "n.yaml").name == "2024"


def test_special_files_are_not_configs(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    for path in ("/dev/null", tmp_path / "fifo.yaml"):
        assert_clean_error(run_cli("train", "--print-config", path), 2, "is not a regular file")


def test_config_path_with_equals_sign(tmp_path):
    folder = tmp_path / "sweep" / "lr=0.001"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("task: {name: copy}\n")
    result = run_cli("train", "--print-config", folder / "config.yaml", "train.steps=7")
    assert result.exit_code == 0, result.stderr
    assert "name: copy" in result.stdout and "steps: 7" in result.stdout


def test_control_characters_are_escaped(empty_cwd):
    result = run_cli("train", "\x1b]0;pwned\x07\x1b[31mred.yaml")
    assert_clean_error(result, 2, "not found", "\\x1b]0;pwned\\x07")
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


# --- L1, L3, L13: command-line mistakes ---

def test_predict_with_a_mistyped_run_says_not_found(run):
    assert_clean_error(run_cli("predict", "runs/bsae", "1 2 3"), 2, "run 'runs/bsae' not found")


def test_bench_refuses_a_bogus_device():
    assert_clean_error(run_cli("bench", "--quick", "--device", "bogus"), 2,
                       "device ('bogus') must be auto, cpu, cuda or cuda:N")


def test_no_arguments_prints_help():
    result = run_cli()
    assert result.exit_code == 0 and "train" in result.stdout and result.stderr == ""


# --- L11: a second signal while stopping ---

def test_a_log_dir_that_is_a_file_says_so(empty_cwd):
    (empty_cwd / "afile").write_text("hi")  # the report's C01/C02: "Not a directory"
    for log_dir in ("afile", "afile/sub"):
        assert_clean_error(run_cli("train", *SHORT, f"log.dir={log_dir}"), 2,
                           "cannot create the run directory", "(Not a directory)")
    assert sorted(p.name for p in empty_cwd.iterdir()) == ["afile"]


def test_second_sigterm_keeps_its_exit_code():
    from minitfm.run.signals import StopSignal

    stop = StopSignal()
    stop._handle(signal.SIGTERM, None)
    with pytest.raises(Interrupted, match="SIGTERM again") as caught:
        stop._handle(signal.SIGTERM, None)
    assert caught.value.exit_code == 143


# --- with real processes: signals at start-up, streams, a full disk ---

# Put on the child's PYTHONPATH as `sitecustomize`: it stops the child inside the import of
# $PAUSE_AT and says so on stdout; the test then signals it, and the hook passes the signal on
# as if it had just arrived (blocked meanwhile, so it cannot land before the hook waits for it).
PAUSE_HOOK = """
import os, signal, sys

class PauseAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["PAUSE_AT"]:
            sys.meta_path.remove(self)
            stopping = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
            os.write(1, b"paused\\n")
            signum = signal.sigwait(stopping)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
            signal.raise_signal(signum)
        return None

sys.meta_path.insert(0, PauseAt())
"""


@pytest.mark.slow
@pytest.mark.parametrize("pause_at,signum", [
    ("typer", signal.SIGINT),  # the report of 2026-11-24, L12 (SIG_early): typer, rich load
    ("typer", signal.SIGTERM),
    ("minitfm.run.memory", signal.SIGINT),  # arguments parsed, no command yet: was a silent 130
    ("torch", signal.SIGINT),  # the report of 2026-11-22, M5: torch swallowed it, ran to exit 0
])
def test_a_signal_at_any_moment_of_start_up_is_one_line(tmp_path, pause_at, signum):
    # Test review of 2026-11-25, #10: the child is stopped at a known point, not after a delay.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(PAUSE_HOOK)
    path = [str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PAUSE_AT": pause_at,
           "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.Popen([sys.executable, "-m", "minitfm", "train", *once(SHORT), "--run-dir",
                             tmp_path / "run"], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == "paused\n", proc.communicate(timeout=120)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)  # a safety net: it ends at once
    finally:
        proc.kill()
        proc.wait()
    name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"
    assert (proc.returncode, stderr) == (
        128 + signum, f"interrupted: {name} while starting: nothing was done\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_output_errors_are_one_line(run):
    proc = minitfm("tasks", shell_suffix="> /dev/full")  # L10
    assert_one_line(proc, 1, "No space left on device")
    proc = minitfm("eval", run, "--samples", "5", "--json", shell_suffix="> /dev/full")  # L13
    assert_one_line(proc, 1, "No space left on device")
    proc = minitfm("predict", run, shell_suffix="<&-")  # L12
    assert_one_line(proc, 2, "stdin is closed")


@pytest.mark.slow
def test_training_goes_on_when_stdout_goes_away(tmp_path):
    run_dir = tmp_path / "head"  # L15: `minitfm train ... | head -1`
    proc = minitfm("train", *SHORT, "train.steps=30", "log.log_every=2", "--run-dir", run_dir,
                   shell_suffix="| head -1")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == 30


def fill_disk_after(limit: int):
    """For a child: files may not grow past `limit` bytes, as on a nearly full disk."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writes fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path):
    run_dir = tmp_path / "full"  # M6: the first checkpoint cannot be written
    proc = minitfm("train", *SHORT, "train.eval_every=10", "--run-dir", run_dir,
                   preexec_fn=fill_disk_after(20_000))
    assert_one_line(proc, 1, "File too large", "no checkpoint was written yet")
    assert "steps: 20" in (run_dir / "config.yaml").read_text()  # whole, never empty
    assert not list((run_dir / "checkpoints").iterdir())  # no temp file left behind
