"""`minitfm.load_runs`: every run under a folder as a row, a pandas DataFrame with pandas and
plain dicts without it; no torch loaded."""

import subprocess
import sys

import pytest

import minitfm
from minitfm.errors import MinitfmError
from tests.lab.many.fakes import fake_run, fake_sweep


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    fake_run(root / "lone", ["train.lr=0.005"], None, 0.5)
    fake_sweep(root / "sweep", {f"seed={seed}": ["train.lr=5e-3", f"seed={seed}"]
                                for seed in (1, 0)} | {"other": ["train.lr=0.01"]})
    return root


def test_a_frame_of_flat_config_keys_summary_exact_match_per_length_and_last_gauges(runs):
    pandas = pytest.importorskip("pandas")
    frame = minitfm.load_runs(runs, where={"train.lr": 0.005})
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame["run"]) == ["lone", "sweep/seed=0", "sweep/seed=1"]  # by seed
    assert {"run", "sweep", "status", "seed", "train.lr", "model.positional", "summary.step",
            "summary.wall_s", "exact_match", "reached", "per_length.1", "per_length.6",
            "gauges.align", "gauges.step"} <= set(frame.columns)
    lone = frame.iloc[0]
    assert (lone["summary.step"], lone["exact_match"], lone["reached"]) == (200, 0.5, False)
    assert lone["per_length.6"] == pytest.approx(0.44) and lone["gauges.align"] == 0.2
    assert list(frame["sweep"][1:]) == ["sweep", "sweep"]
    everything = minitfm.load_runs(str(runs))
    assert len(everything) == 4 and set(everything["train.lr"]) == {0.005, 0.01}


def test_without_pandas_the_rows_are_dicts_and_as_frame_says_how_to_get_it(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    rows = minitfm.load_runs(runs, where={"seed": 1})
    assert isinstance(rows, list) and [row["run"] for row in rows] == ["sweep/seed=1"]
    assert rows[0]["train.lr"] == 0.005 and rows[0]["gauges.step"] == 100
    with pytest.raises(MinitfmError, match=r"pip install 'minitfm\[frame\]'"):
        minitfm.load_runs(runs, as_frame=True)
    assert minitfm.load_runs(runs, as_frame=False) == minitfm.load_runs(runs)


@pytest.mark.parametrize("kwargs, needle", [
    ({"where": {"lr": 0.005}}, "did you mean 'train.lr'?"),
    ({"where": ["train.lr=0.005"]}, "where must map keys to values"),
    ({"as_frame": "yes"}, "as_frame must be True, False or None"),
])
def test_mistakes_raise_one_line(runs, kwargs, needle):
    with pytest.raises(MinitfmError, match=needle.replace("(", r"\(").replace("?", r"\?")):
        minitfm.load_runs(runs, **kwargs)


def test_load_runs_loads_no_torch(runs):
    code = ("import sys, minitfm; rows = minitfm.load_runs(sys.argv[1], as_frame=False); "
            "print(len(rows), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(runs)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4", "False"]
