"""Grokking's three phases drawn from a run's records (`lab/watch/phases.py`), and `minitfm plot
RUN --phases`, which draws them for one's own modadd run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minitfm.config import load_config, to_yaml
from minitfm.errors import shown_path
from minitfm.lab.pictures import is_minitfm_picture
from minitfm.lab.watch.phases import describe_phases, draw_phases, phase_steps, read_phases
from tests.helpers import assert_clean_error, run_cli
from tests.tasks.test_grokking import TINY_MODADD

ROOT = Path(__file__).resolve().parents[3]


def write_metrics(run_dir: Path, lines: list) -> None:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(
        (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def test_the_phases_are_read_from_the_eval_and_gauge_lines(tmp_path):
    gauges = {"exact": 0.1, "loss": 2.0, "token_accuracy": 0.5,  # every reading's own
              "restricted_loss": 2.0, "excluded_loss": 0.01, "fourier_sparsity": 0.3}
    lines = [{"step": 100, "split": "train", "loss": 1.0},
             {"step": 100, "split": "gauges", "train_exact": 0.5, **gauges},
             {"step": 100, "split": "eval", "loss": 3.0, "exact_match": 0.1},
             {"step": 200, "split": "gauges", "train_exact": 1.0, **gauges},
             {"step": 200, "split": "eval", "loss": 3.0, "exact_match": 0.1},
             {"step": 300, "split": "eval", "loss": 2.0, "exact_match": 0.3},
             "not json", {"step": "x", "split": "eval", "exact_match": 0.9},
             {"step": 400, "split": "eval", "loss": 1.0, "exact_match": 0.6},
             {"step": 500, "split": "gauges", "train_exact": 1.0, **gauges,
              "restricted_loss": 0.1},
             {"step": 500, "split": "eval", "loss": 0.1, "exact_match": 0.995}]
    write_metrics(tmp_path / "run", lines)
    curves = read_phases(tmp_path / "run")
    assert curves["held_out"] == [(100, 0.1), (200, 0.1), (300, 0.3), (400, 0.6), (500, 0.995)]
    assert curves["restricted_loss"] == [(100, 2.0), (200, 2.0), (500, 0.1)]
    assert phase_steps(curves) == {"memorised": 200, "jump_begins": 300, "grokked": 500}
    found = draw_phases(tmp_path / "run", tmp_path / "phases.png")
    assert found["phases"] == phase_steps(curves)
    assert found["gauges"]["grokked"]["restricted_loss"] == 0.1
    assert (tmp_path / "phases.png").read_bytes().startswith(b"\x89PNG")


def test_a_run_not_yet_memorised_or_grokked_is_said_so_not_step_none():
    assert describe_phases({"memorised": 60, "jump_begins": 3300, "grokked": 4200}) == \
        "memorised by step 60, held-out 99% at step 4200"  # the docs' figure's title, as before
    assert describe_phases({"memorised": 60, "jump_begins": None, "grokked": None}) == \
        "memorised by step 60, held-out exact match not yet at 99%"
    assert describe_phases({"memorised": None, "jump_begins": None, "grokked": None}) == \
        "not memorised yet (training exact match under 99%)"


@pytest.fixture(scope="module")
def modadd_run(tmp_path_factory):
    """A tiny modadd run with grokking's gauges at steps 10 and 20."""
    run_dir = tmp_path_factory.mktemp("phases") / "modadd"
    result = run_cli("train", *TINY_MODADD, "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    return run_dir


def docs_state() -> dict[str, tuple[int, int]]:
    """Every file under docs/: its size and modification time."""
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted((ROOT / "docs").rglob("*")) if path.is_file()}


def test_plot_phases_draws_ones_own_run_beside_it_and_leaves_docs_alone(modadd_run, tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)  # anywhere: a clone's root or not
    before = docs_state()
    result = run_cli("plot", modadd_run, "--phases")
    assert result.exit_code == 0, result.stderr
    png = modadd_run / "phases.png"
    steps = phase_steps(read_phases(modadd_run))
    assert result.stdout.splitlines() == [f"phases: {describe_phases(steps)}",
                                          f"wrote {shown_path(png)}"]
    assert is_minitfm_picture(png)
    assert docs_state() == before and list(tmp_path.iterdir()) == []
    # the picture rule: --out elsewhere, a user's file there kept unless --force
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG\r\n\x1a\n a user's picture")
    assert_clean_error(run_cli("plot", modadd_run, "--phases", "--out", mine), 2,
                       f"--out ('{mine}') exists and is not a picture minitfm wrote", "--force")
    assert mine.read_bytes().endswith(b"a user's picture")
    forced = run_cli("plot", modadd_run, "--phases", "--out", mine, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert is_minitfm_picture(mine)


def fake_run(run_dir: Path, task: str, lines: list[dict]) -> Path:
    """A run directory of `task` holding a config.yaml and these metrics.jsonl lines."""
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(load_config(None, [f"task.name={task}"])))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


EVAL = {"step": 10, "split": "eval", "loss": 1.0, "exact_match": 0.5}


@pytest.mark.parametrize("task,needles", [
    ("copy", ["learns 'copy'", "--phases draws grokking's phases", "a modadd run",
              "--metric KEY"]),
    ("modadd", ["has no grokking gauges in its metrics.jsonl", "log.gauge_every=20"]),
])
def test_plot_phases_refuses_a_run_without_grokkings_gauges_in_one_line(tmp_path, task,
                                                                       needles):
    run_dir = fake_run(tmp_path / "run", task, [EVAL])
    result = run_cli("plot", run_dir, "--phases")
    assert_clean_error(result, 2, f"run '{run_dir}'", *needles)
    assert not (run_dir / "phases.png").exists()


def test_plot_phases_takes_one_run_and_no_metric(modadd_run):
    for args in ([modadd_run, modadd_run, "--phases"], [modadd_run, "--phases", "--metric",
                                                        "loss"]):
        assert_clean_error(run_cli("plot", *args), 2, "--phases draws one run's own panels",
                           "give one RUN, without --metric")
