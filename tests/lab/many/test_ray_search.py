"""A search on Ray, on a real two-node cluster of this machine (`test_ray.cluster`): its trials
told to the one study in the sweep folder, hopeless ones pruned there as on this machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import TINY, given_once
from tests.lab.many.test_ray import cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # a cluster of processes, and searches on it
optuna = pytest.importorskip("optuna")


def test_a_search_on_two_nodes_tells_one_study_and_prunes_there(cluster, tmp_path):  # noqa: F811
    out = tmp_path / "s"
    args = given_once(["sweep", *TINY, "log.tensorboard=false", "train.eval_every=100",
                       "train.lr=tag(log,interval(1e-6,2e-6))", "--seeds", "0,1",
                       "--trials", "2", "--prune", "forecast", "--threads", "1",
                       "--eval-samples", "20", "--on", "ray", "--ray-address",
                       cluster.address, "--out", out])
    # a process of its own, as a user's: Ray reads its token as it is imported, and this one
    # has imported it (`test_ray.ray_or_skip`) before the cluster's token was set
    result = subprocess.run([sys.executable, "-m", "minitfm", *map(str, args)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 nodes, 2 CPUs" in result.stdout and "2 runs at a time" in result.stdout
    trials = [json.loads(line) for line in (out / "trials.jsonl").open()]
    assert [t["state"] for t in trials] == ["pruned", "pruned"]
    assert all("short of 99%" in t["pruned"] for t in trials)
    for trial in trials:
        for run in trial["runs"]:
            summary = json.loads((out / run / "summary.json").read_text())
            assert summary["status"] == "interrupted" and summary["step"] < 200
            assert (out / run / "checkpoints" / "last.pt").is_file()
    study = optuna.load_study(study_name="minitfm", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    assert "2 trials: 2 pruned; none complete" in result.stdout
