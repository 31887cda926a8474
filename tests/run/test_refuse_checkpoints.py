"""Hostile, broken and misplaced checkpoints and run directories: one line, exit 2, nothing
written (issue #16; the cases of the adversarial report of 2026-11-22)."""

import os
import pickle
import shutil
import zipfile

import pytest
import torch

from minitfm.errors import CheckpointError
from minitfm.run.checkpoint import load_checkpoint
from minitfm.run.rundir import find_run_dir, is_run_dir
from minitfm.run.which_run import pick_checkpoint
from tests.helpers import TINY, assert_clean_error, run_cli

FAST = [*TINY, "train.steps=20", "log.tensorboard=false", "log.log_every=10"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished tiny run (step 20) with best.pt and last.pt; tests copy it, never change it."""
    run_dir = tmp_path_factory.mktemp("base") / "run"
    result = run_cli("train", *FAST, "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    return run_dir


@pytest.fixture
def run_copy(base, tmp_path):
    """A private copy of the base run."""
    return shutil.copytree(base, tmp_path / "run")


def snapshot(root):
    """Every path under `root` with its size and mtime: equal snapshots mean nothing written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def saved_state(base, **changes):
    """The base run's last.pt with keys changed; a value None deletes the key."""
    state = torch.load(base / "checkpoints" / "last.pt", weights_only=True)
    for key, value in changes.items():
        if value is None:
            del state[key]
        else:
            state[key] = value
    return state


# --- H1: a checkpoint outside <run>/checkpoints/ never writes into its grandparent ---

@pytest.fixture
def outside(base, tmp_path):
    """outside/home/Downloads/model.pt beside an unrelated outside/home/config.yaml."""
    downloads = tmp_path / "outside" / "home" / "Downloads"
    downloads.mkdir(parents=True)
    shutil.copy(base / "checkpoints" / "last.pt", downloads / "model.pt")
    (tmp_path / "outside" / "home" / "config.yaml").write_text("my notes\n")
    return downloads / "model.pt"


def test_resume_of_a_loose_checkpoint_needs_run_dir(outside, tmp_path):
    before = snapshot(tmp_path)
    result = run_cli("train", "--resume", outside, "train.steps=22")
    assert_clean_error(result, 2, "model.pt", "not inside a minitfm run", "--run-dir")
    assert snapshot(tmp_path) == before


def test_a_loose_checkpoint_continues_in_the_run_dir_given(outside, tmp_path):
    home = outside.parent.parent
    before = snapshot(home)
    result = run_cli("train", "--resume", outside, "--run-dir", tmp_path / "new",
                     "train.steps=22")
    assert result.exit_code == 0, result.stderr
    assert load_checkpoint(tmp_path / "new" / "checkpoints" / "last.pt")["step"] == 22
    assert snapshot(home) == before


def test_a_loose_checkpoint_may_continue_in_a_minitfm_run(outside, run_copy):
    result = run_cli("train", "--resume", outside, "--run-dir", run_copy, "train.steps=22")
    assert result.exit_code == 0, result.stderr
    assert load_checkpoint(run_copy / "checkpoints" / "last.pt")["step"] == 22


def test_a_loose_checkpoint_never_goes_into_a_foreign_directory(outside, tmp_path):
    home = outside.parent.parent
    before = snapshot(home)
    result = run_cli("train", "--resume", outside, "--run-dir", home, "train.steps=22")
    assert_clean_error(result, 2, "holds no minitfm run")
    assert snapshot(home) == before


def test_checkpoints_folder_of_a_non_run_is_loose(base, tmp_path):
    """A parent named checkpoints/ is not enough: the grandparent must look like a run."""
    fake = tmp_path / "project" / "checkpoints"
    fake.mkdir(parents=True)
    shutil.copy(base / "checkpoints" / "last.pt", fake / "last.pt")
    assert find_run_dir(fake / "last.pt") is None
    assert find_run_dir(base / "checkpoints" / "last.pt") == base.resolve()
    before = snapshot(tmp_path)
    assert_clean_error(run_cli("train", "--resume", tmp_path / "project"), 2,
                       "not inside a minitfm run")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", [["eval", "--samples", "5"], ["predict", "{pt}", "1 2 3"]])
def test_a_loose_checkpoint_evaluates_and_writes_nothing(outside, tmp_path, command):
    args = [str(outside) if a == "{pt}" else a for a in command]
    if args[0] == "eval":
        args.insert(1, str(outside))
    before = snapshot(tmp_path)
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    assert snapshot(tmp_path) == before


def test_visualize_a_loose_checkpoint_writes_beside_it(outside):
    home = outside.parent.parent
    result = run_cli("visualize-attention", outside, "--no-terminal")
    assert result.exit_code == 0, result.stderr
    assert (outside.parent / "model-attention-step20.png").is_file()
    assert sorted(p.name for p in home.iterdir()) == ["Downloads", "config.yaml"]
    assert (home / "config.yaml").read_text() == "my notes\n"


# --- H3, L9: archives and pickles are inspected before torch.load ---

def deflated_bomb(path):
    """A zip entry that declares 200 MB of zeros in about 200 KB: cheap to build."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("archive/data.pkl", "w", force_zip64=True) as entry:
            block = bytes(2**20)
            for _ in range(200):
                entry.write(block)
        z.writestr("archive/version", "3\n")


def stored_liar(path):
    """A stored entry whose central directory declares 4 GB in a file of a few hundred bytes."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    data = bytearray(path.read_bytes())
    central = data.index(b"PK\x01\x02")
    data[central + 24:central + 28] = (0xFFFFFFF0).to_bytes(4, "little")  # uncompressed size
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("build,needle", [(deflated_bomb, "compressed"),
                                          (stored_liar, "declare")])
def test_a_zip_bomb_is_refused_before_loading(tmp_path, monkeypatch, build, needle):
    bomb = tmp_path / "zipbomb.pt"
    build(bomb)

    def no_load(*args, **kwargs):
        raise AssertionError("torch.load was called on a zip bomb")

    monkeypatch.setattr(torch, "load", no_load)
    before = snapshot(tmp_path)
    assert_clean_error(run_cli("eval", bomb, "--samples", "10"), 2, "zipbomb.pt", "refused",
                       needle)
    assert snapshot(tmp_path) == before


class Evil:
    """Unpickling this would create a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_raw_pickle_is_refused_in_one_line(tmp_path, protocol):
    marker, evil = tmp_path / "pwned", tmp_path / "evil_raw.pt"
    evil.write_bytes(pickle.dumps({"format": "minitfm-checkpoint/1", "x": Evil(marker)},
                                  protocol=protocol))
    for args in (["eval", evil], ["train", "--resume", evil]):
        assert_clean_error(run_cli(*args), 2, "refused", "system")  # one line: no UserWarning
    assert not marker.exists()


# --- M4, L8: the checkpoint's structure and config are checked in one place ---

BROKEN = [
    ({"step": None}, "missing 'step'"),
    ({"step": "abc"}, "'step' must be an integer, got str"),
    ({"step": True}, "'step' must be an integer, got bool"),
    ({"model": None}, "missing 'model'"),
    ({"config": None}, "missing 'config'"),
    ({"config": "hello"}, "'config' must be a mapping, got str"),
    ({"vocab": None}, "missing 'vocab'"),
    ({"vocab": [1, 2]}, "'vocab' must be a list of strings"),
]
RESUME_ONLY = [
    ({"optimizer": None}, "missing 'optimizer'"),
    ({"rng": None}, "missing 'rng'"),
    ({"rng": {"torch": torch.get_rng_state()}}, "missing 'rng.data'"),
    ({"best_exact_match": None}, "missing 'best_exact_match'"),
    ({"best_exact_match": "high"}, "'best_exact_match' must be a number, got str"),
]


def bad_config(base, section, key, value):
    state = saved_state(base)
    state["config"][section] = value if key is None else {**state["config"][section],
                                                          key: value}
    return state


CONFIGS = [
    (("model", "d_model", -1), "model.d_model"),
    (("task", "name", "bogus"), "task.name"),
    (("model", None, 5), "'model' must be a mapping"),
]


def ids(cases):
    """Test ids: the message each case expects."""
    return [needle for _, needle in cases]


@pytest.mark.parametrize("changes,needle", BROKEN, ids=ids(BROKEN))
def test_eval_of_a_broken_checkpoint(base, tmp_path, changes, needle):
    path = tmp_path / "broken.pt"
    torch.save(saved_state(base, **changes), path)
    before = snapshot(tmp_path)
    assert_clean_error(run_cli("eval", path), 2, "broken.pt", "does not fit", needle)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("changes,needle", BROKEN + RESUME_ONLY,
                         ids=ids(BROKEN + RESUME_ONLY))
def test_resume_of_a_broken_checkpoint_writes_nothing(base, run_copy, changes, needle):
    torch.save(saved_state(base, **changes), run_copy / "checkpoints" / "last.pt")
    before = snapshot(run_copy)
    assert_clean_error(run_cli("train", "--resume", run_copy, "train.steps=22"), 2,
                       "does not fit", needle)
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("change,needle", CONFIGS, ids=ids(CONFIGS))
def test_an_invalid_embedded_config_names_the_checkpoint(base, run_copy, change, needle):
    torch.save(bad_config(base, *change), run_copy / "checkpoints" / "last.pt")
    before = snapshot(run_copy)
    for args in (["eval", run_copy, "--checkpoint", "last"], ["train", "--resume", run_copy]):
        assert_clean_error(run_cli(*args), 2, "last.pt' has an invalid config", needle)
    assert snapshot(run_copy) == before


def test_eval_without_rng_still_works(base, tmp_path):
    path = tmp_path / "no_rng.pt"
    torch.save(saved_state(base, rng=None, optimizer=None), path)
    result = run_cli("eval", path, "--samples", "5")
    assert result.exit_code == 0, result.stderr


# --- M8, L10, L16: run directories ---

@pytest.mark.parametrize("extra", [["--run-dir", "afile"], ["log.dir=" + "d" * 300],
                                   ["--run-dir", "r" * 300], ["--run-dir", "afile/run"]],
                         ids=["file", "long-log-dir", "long-run-dir", "under-a-file"])
def test_a_bad_run_dir_is_bad_input(tmp_path, monkeypatch, extra):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("hi")
    result = run_cli("train", *FAST, "log.dir=runs", *extra)  # (a name over 100 characters
    # is refused by the config itself: tests/test_refuse_inputs.py)
    assert_clean_error(result, 2, "cannot create the run directory")
    assert "stay valid" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_run_dir_with_resume_of_a_run_is_refused(run_copy, tmp_path):
    before = snapshot(tmp_path)
    result = run_cli("train", "--resume", run_copy, "--run-dir", tmp_path / "elsewhere",
                     "train.steps=22")
    assert_clean_error(result, 2, "--run-dir", "cannot be combined")
    assert snapshot(tmp_path) == before


def test_overwrite_with_resume_is_refused(run_copy):
    before = snapshot(run_copy)
    assert_clean_error(run_cli("train", "--resume", run_copy, "--overwrite"), 2, "--overwrite")
    assert snapshot(run_copy) == before


def test_overwrite_of_a_directory_that_is_no_run_is_refused(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "config.yaml").write_text("my precious config\n")
    before = snapshot(tmp_path)
    result = run_cli("train", *FAST, "train.steps=2", "--run-dir", project, "--overwrite")
    assert_clean_error(result, 2, "proj", "holds no minitfm run")
    assert snapshot(tmp_path) == before


def test_a_hand_written_config_is_no_run(tmp_path, base):
    (tmp_path / "config.yaml").write_text("name: copy\ntask:\n  name: copy\n")
    os.mkfifo(tmp_path / "metrics.jsonl")  # must not block
    assert not is_run_dir(tmp_path)
    assert is_run_dir(base)


# --- M9, L12 and best.pt -> last.pt: which checkpoint a RUN means ---

def test_an_empty_newer_run_does_not_hide_a_good_one(base, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(base, tmp_path / "runs" / "good")
    empty = tmp_path / "runs" / "failed" / "checkpoints"
    empty.mkdir(parents=True)
    os.utime(empty, (2**31, 2**31))  # newer than anything
    result = run_cli("eval", "--samples", "5")
    assert result.exit_code == 0, result.stderr
    assert "good" in result.stdout
    assert run_cli("predict", "1 2 3").exit_code == 0


def test_left_out_a_run_is_the_most_recent_one(base, tmp_path, monkeypatch):
    """README: a RUN left out is the most recent run under ./runs (by its checkpoints' time,
    not its name)."""
    monkeypatch.chdir(tmp_path)
    for name in ("a-first", "b-second"):
        shutil.copytree(base, tmp_path / "runs" / name)
    for newer, older in (("a-first", "b-second"), ("b-second", "a-first")):
        os.utime(tmp_path / "runs" / newer / "checkpoints", (2_000_000_000, 2_000_000_000))
        os.utime(tmp_path / "runs" / older / "checkpoints", (1_000_000_000, 1_000_000_000))
        result = run_cli("eval", "--samples", "5")
        assert result.exit_code == 0, result.stderr
        title = result.stdout.splitlines()[0]
        assert f"runs/{newer}/checkpoints/best.pt" in title and older not in title, title


def test_best_pt_that_is_a_directory(tmp_path):
    (tmp_path / "fakerun" / "checkpoints" / "best.pt").mkdir(parents=True)
    assert_clean_error(run_cli("eval", tmp_path / "fakerun"), 2, "best.pt' is not a file")


@pytest.mark.parametrize("command", [["eval", "--samples", "5"], ["predict", "1 2 3"],
                                     ["visualize-attention", "--no-terminal"],
                                     ["eval", "--samples", "5", "--checkpoint", "best"]])
def test_a_run_without_best_uses_last_with_a_note(run_copy, tmp_path, monkeypatch, command):
    (run_copy / "checkpoints" / "best.pt").unlink()
    monkeypatch.chdir(tmp_path)
    result = run_cli(command[0], run_copy, *command[1:])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == (f"note: run '{run_copy}' has no best.pt yet (not "
                                     f"evaluated so far): using last.pt")


def test_last_is_never_replaced_by_best(run_copy):
    (run_copy / "checkpoints" / "last.pt").unlink()
    assert_clean_error(run_cli("eval", run_copy, "--checkpoint", "last"), 2,
                       "no last checkpoint", "best.pt")
    with pytest.raises(CheckpointError, match="no last checkpoint"):
        pick_checkpoint(run_copy, "last")


def test_checkpoints_honour_the_umask(base):
    mask = os.umask(0o022)
    os.umask(mask)
    for name in ("best.pt", "last.pt"):
        mode = (base / "checkpoints" / name).stat().st_mode & 0o777
        assert mode == 0o666 & ~mask, oct(mode)
