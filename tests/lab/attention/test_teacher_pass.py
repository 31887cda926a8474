"""One teacher-forced pass over the held-out pairs, read by the gauges and the attention snapshot
of the same step (lab/attention/probe.py, `LatestPass`)."""

from __future__ import annotations

import json

import torch

from minitfm.app.api import train_run
from minitfm.config import load_config
from minitfm.lab.attention import probe
from minitfm.lab.attention.probe import LatestPass, head_scores, scores_of
from minitfm.lab.loaded import load
from minitfm.lab.watch.gauges import read_gauges
from tests.helpers import QUICK


def test_the_gauges_and_the_snapshot_of_one_step_share_its_pass(tmp_path, monkeypatch):
    made = []
    teacher_pass = probe.teacher_pass
    monkeypatch.setattr(probe, "teacher_pass",
                        lambda model, task, pairs: made.append(len(pairs)) or
                        teacher_pass(model, task, pairs))
    cfg = load_config(None, [*QUICK, "train.steps=20", "train.eval_every=0",
                             "log.gauge_every=5", "log.attention_every=10"])
    train_run(cfg, run_dir=tmp_path / "run")
    gauges = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl")
              .read_text().splitlines() if json.loads(line)["split"] == "gauges"]
    snapshots = [json.loads(line)["step"] for line in
                 (tmp_path / "run" / "attention.jsonl").read_text().splitlines()]
    assert gauges == [5, 10, 15, 20] and snapshots == [10, 20]
    assert len(made) == 4  # six readers, two pairs of them at steps 10 and 20
    assert set(made) == {200}  # the first 200 held-out pairs, for both


def test_a_pass_is_made_again_for_other_weights_pairs_or_steps(tmp_path):
    cfg = load_config(None, [*QUICK, "train.steps=5", "train.eval_every=0"])
    train_run(cfg, run_dir=tmp_path / "run")
    loaded = load(tmp_path / "run", checkpoint="last")
    model, task, pairs = loaded.model, loaded.task, loaded.held_out()[:50]
    passes = LatestPass()
    first = passes.at(5, model, task, pairs)
    assert passes.at(5, model, task, list(pairs)) is first  # equal pairs: the same pass
    assert passes.at(6, model, task, pairs) is not first  # another step
    second = passes.at(6, model, task, pairs)
    assert passes.at(6, model, task, pairs[:49]) is not second  # other pairs
    third = passes.at(6, model, task, pairs)
    with torch.no_grad():
        next(model.parameters()).mul_(0.5)  # the weights move, the step says nothing
    fourth = passes.at(6, model, task, pairs)
    assert fourth is not third and not torch.equal(fourth.logits, third.logits)


def test_readings_and_scores_from_a_shared_pass_are_those_of_their_own(tmp_path):
    cfg = load_config(None, [*QUICK, "train.steps=5", "train.eval_every=0"])
    train_run(cfg, run_dir=tmp_path / "run")
    loaded = load(tmp_path / "run", checkpoint="last")
    model, task, pairs = loaded.model, loaded.task, loaded.held_out()[:200]
    passes = LatestPass()
    shared = read_gauges(model, task, pairs, 5, passes)
    scores = scores_of(passes.at(5, model, task, pairs), task, pairs)
    alone = head_scores(model, task, pairs)
    assert shared == read_gauges(model, task, pairs, 5)
    for kind in ("soft", "hard", "entropy"):
        assert torch.equal(getattr(scores, kind), getattr(alone, kind)), kind
