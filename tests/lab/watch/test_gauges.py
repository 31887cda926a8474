"""The gauges (lab/watch/gauges.py): read live every log.gauge_every steps, in metrics.jsonl,
TensorBoard and the progress line (the forecast made from them: test_forecast.py)."""

from __future__ import annotations

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minitfm.book.metrics import evaluate
from minitfm.config import TaskConfig, load_config
from minitfm.lab.attention.probe import head_scores
from minitfm.lab.curves import read_metrics
from minitfm.lab.loaded import load
from minitfm.lab.watch.gauges import GAUGE_SAMPLES, add_keys, alignment, read_gauges
from minitfm.tasks import make_task
from tests.helpers import QUICK, run_cli


def gauge_lines(run_dir) -> list[dict]:
    lines = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [line for line in lines if line["split"] == "gauges"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """QUICK (50 steps of copy) with a reading every 10 steps; the console's lines."""
    out = tmp_path_factory.mktemp("gauges") / "run"
    result = run_cli("train", *QUICK, "log.gauge_every=10", "--run-dir", out)
    assert result.exit_code == 0, result.stdout + result.stderr
    return out, result.stdout


def test_a_reading_every_gauge_every_steps_in_metrics_jsonl(run):
    run_dir, _ = run
    lines = gauge_lines(run_dir)
    assert [line["step"] for line in lines] == [10, 20, 30, 40, 50]
    for line in lines:
        assert 0 <= line["exact"] <= line["token_accuracy"] <= 1
        assert line["loss"] > 0
        assert 0 < line["align"] <= line["coverage"] <= 1 and line["weight_norm"] > 0
        assert len(line["heads"]) == 1 and len(line["heads"][0]) == 2  # layers x heads
        assert line["align"] == max(line["heads"][0])  # the best head's score
        assert len(line["positions"]) == 7  # copy of up to 6 symbols: 6 tokens and EOS
    assert {record["split"] for record in read_metrics(run_dir)} == {"train", "eval", "gauges"}


def test_hard_loss_is_the_mean_loss_of_the_hardest_quarter_of_positions(run):
    """The last reading's hard_loss, against the model it read (last.pt, the same step): each
    held-out pair through the model alone, the mean loss at each of the 7 output positions,
    and the mean of the 2 highest (a quarter of 7, rounded)."""
    run_dir, _ = run
    loaded = load(run_dir, checkpoint="last")
    vocab = loaded.task.vocab
    by_position: dict[int, list[float]] = {}
    with torch.no_grad():
        for src, target in loaded.held_out()[:GAUGE_SAMPLES]:
            logits = loaded.model(torch.tensor([src]), torch.tensor([[vocab.bos_id, *target]]))
            losses = torch.nn.functional.cross_entropy(
                logits[0], torch.tensor([*target, vocab.eos_id]), reduction="none")
            for t, loss in enumerate(losses.tolist()):
                by_position.setdefault(t, []).append(loss)
    means = sorted((sum(v) / len(v) for v in by_position.values()), reverse=True)
    assert len(means) == 7 and means[1] > means[3]  # a quarter and a half would differ
    line = gauge_lines(run_dir)[-1]
    assert line["step"] == loaded.step == 50
    assert line["hard_loss"] == pytest.approx((means[0] + means[1]) / 2, rel=1e-4)


def test_exact_is_greedy_exact_match_without_decoding(run):
    """A greedy decoder is right exactly when each teacher-forced step's argmax is the
    target's token: the reading's `exact` is the evaluation's exact match on the same pairs."""
    run_dir, _ = run
    loaded = load(run_dir, checkpoint="last")
    pairs = loaded.held_out()[:200]
    reading = read_gauges(loaded.model, loaded.task, pairs, step=50)
    greedy = evaluate(loaded.model, loaded.task, pairs, loaded.device)
    assert 0 < greedy.exact_match < 1  # a run half way: both kinds of pairs are there
    assert reading.exact == pytest.approx(greedy.exact_match)
    assert reading.loss == pytest.approx(greedy.loss, rel=1e-4)
    assert reading.step == 50 and gauge_lines(run_dir)[-1]["exact"] == reading.exact
    scores = head_scores(loaded.model, loaded.task, pairs)  # what visualize-attention prints
    assert reading.heads[0] == pytest.approx(scores.soft[0].tolist(), abs=1e-6)
    assert reading.align == pytest.approx(float(scores.soft.max()), abs=1e-6)


def test_the_best_layer_covers_the_alignment_that_its_heads_share():
    """Two heads that each read the ideal source for half the rows: each scores 0.5, the
    layer covers every row."""
    task = make_task(TaskConfig(name="reverse", n_symbols=5, min_len=4, max_len=4))
    pairs = [([3, 4, 5, 6], task.target([3, 4, 5, 6]))]
    cross = torch.zeros(1, 2, 5, 4)  # (B, H, T, S): 4 outputs and EOS
    for t in range(4):
        cross[0, t % 2, t, 3 - t] = 1.0  # head t % 2 reads the mirrored position
        cross[0, 1 - t % 2, t, (4 - t) % 4] = 1.0  # the other rests beside it
    cross[:, :, 4, 0] = 1.0  # EOS's row has no ideal position
    align, heads = alignment([cross], task, pairs, T=5)
    assert heads == [[0.5, 0.5]] and align == 1.0


def test_the_progress_line_shows_the_alignment_and_how_it_moved(run):
    _, stdout = run
    lines = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert "align 0." in lines[0] and not any(arrow in lines[0] for arrow in "↑↓→")
    assert all(any(f"align 0.{d}" in line for d in "0123456789") and
               any(arrow in line for arrow in "↑↓→") for line in lines[1:]), lines


def test_tensorboard_plots_each_gauge(run):
    run_dir, _ = run
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"7_gauges/exact", "7_gauges/align", "7_gauges/hard_loss",
            "7_gauges/weight_norm", "7_gauges/token_accuracy"} <= tags
    assert [e.step for e in events.Scalars("7_gauges/align")] == [10, 20, 30, 40, 50]
    forecasts = [(line["step"], line["forecast"]["end_exact"]) for line in gauge_lines(run_dir)
                 if line["forecast"] and line["forecast"]["end_exact"] is not None]
    assert forecasts  # the forecast's numbers too, at the readings that made them
    assert [(e.step, e.value) for e in events.Scalars("7_gauges/forecast_end_exact")] == \
        [(step, pytest.approx(value)) for step, value in forecasts]


def test_a_task_without_an_ideal_alignment_shows_its_token_accuracy(tmp_path):
    """Pairs of one's own: no ideal alignment, so the line shows the token accuracy."""
    pairs = tmp_path / "upper.tsv"
    pairs.write_text("".join(f"{w}\t{w.upper()}\n" for w in ("ab", "cat", "dog", "emu", "fox")))
    mine = [item for item in QUICK if not item.startswith(("task.n_symbols", "task.max_len"))]
    result = run_cli("train", *mine, "task.name=pairs", f"task.train_path={pairs}",
                     f"task.eval_path={pairs}", "model.max_len=16", "train.steps=10",
                     "log.gauge_every=5", "log.log_every=5", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = gauge_lines(tmp_path / "run")
    assert [line["step"] for line in lines] == [5, 10]
    assert all(line["align"] is None and line["coverage"] is None and line["heads"] is None
               for line in lines)
    assert "tokens 0." in result.stdout and "align" not in result.stdout


def test_the_progress_line_says_the_forecast_is_uncalibrated_for_pairs_of_ones_own(tmp_path):
    """The forecast was measured on reverse, sort and copy: on pairs of one's own the progress
    line says so before the line's words, in the plain log as in metrics.jsonl."""
    pairs = tmp_path / "upper.tsv"
    pairs.write_text("".join(f"{w}\t{w.upper()}\n" for w in ("ab", "cat", "dog", "emu", "fox")))
    mine = [item for item in QUICK if not item.startswith(("task.n_symbols", "task.max_len",
                                                           "train.steps", "train.warmup_steps",
                                                           "train.lr"))]
    result = run_cli("train", *mine, "task.name=pairs", f"task.train_path={pairs}",
                     f"task.eval_path={pairs}", "model.max_len=16", "train.steps=30",
                     "train.warmup_steps=0", "train.lr=0.002", "log.gauge_every=5",
                     "log.log_every=10", "--run-dir", tmp_path / "run")  # no click by step 30
    assert result.exit_code == 0, result.stdout + result.stderr
    said = [line["forecast"]["text"] for line in gauge_lines(tmp_path / "run")
            if line["forecast"] and not line["forecast"]["clicked"]]
    assert said and all(text.startswith("uncalibrated for pairs: ") for text in said), said
    assert "uncalibrated for pairs: " in result.stdout


def test_an_output_digit_of_a_sum_should_read_both_digits_of_its_significance():
    """add's ideal (carry-aware): 47+85 -> 132, the 3 reads 4 and 8, the 2 reads 7 and 5, the
    carry-out 1 both leading digits; 123+4 -> 127, the 1 and 2 read a's digits alone."""
    task = make_task(TaskConfig(name="add", n_symbols=10, min_len=1, max_len=3))
    forty_seven = task.parse("47+85")
    assert add_keys(task, forty_seven, 3) == [[0, 3], [0, 3], [1, 4]]
    assert add_keys(task, task.parse("123+4"), 3) == [[0], [1], [2, 4]]
    cross = torch.zeros(1, 2, 4, 5)  # (B, H, T, S): 3 digits and EOS over 4 7 + 8 5
    cross[0, 0, :3, 0] = cross[0, 1, :3, 3] = 0.5  # each head: half on one leading digit
    cross[0, 0, 2, :] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])  # head 0 reads 7 for the 2
    cross[0, :, 3, 2] = 1.0  # EOS rests on '+'
    align, heads = alignment([cross], task, [(forty_seven, task.target(forty_seven))], T=4)
    assert heads == [[pytest.approx((0.5 + 0.5 + 1.0) / 3), pytest.approx(1.0 / 3)]]
    assert align == pytest.approx((0.5 + 0.5 + 1.0) / 3)  # the best head covers each row best


def test_gauges_off_read_nothing(tmp_path):
    result = run_cli("train", *QUICK, "train.steps=10", "log.gauge_every=0",
                     "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert gauge_lines(tmp_path / "run") == [] and "align" not in result.stdout


def test_the_explorer_page_embeds_the_readings_and_their_forecasts(run):
    from minitfm.lab.explore.explorer import page_data

    run_dir, _ = run
    data = page_data(load(run_dir, checkpoint="last"))
    assert data["curves"]["gauges"] == [
        [r["step"], r["exact"], r["token_accuracy"], r["align"],
         r["forecast"]["text"] if r["forecast"] else None] for r in gauge_lines(run_dir)]


def test_a_resumed_run_forecasts_from_its_earlier_readings(tmp_path):
    """Paused at step 30 and resumed, a run's readings and forecasts are the straight run's."""
    from minitfm.app.api import train_run

    cfg = load_config(None, [*QUICK, "log.tensorboard=false", "train.target_exact_match=null"])
    train_run(cfg, run_dir=tmp_path / "straight")
    train_run(cfg, run_dir=tmp_path / "paused", stop_at=30)
    train_run(None, resume=tmp_path / "paused" / "checkpoints" / "last.pt")
    straight, resumed = gauge_lines(tmp_path / "straight"), gauge_lines(tmp_path / "paused")
    assert [line["forecast"] for line in resumed] == [line["forecast"] for line in straight]
    assert any(line["forecast"] for line in straight)  # it forecast something to compare


def test_a_resumed_run_forecasts_only_from_readings_a_run_makes(tmp_path):
    """Lines among the earlier readings that no run writes (an exact match of 7, a token
    accuracy of -5, a step of 401 digits) are left out of the resumed run's forecasts."""
    from minitfm.app.api import train_run

    cfg = load_config(None, [*QUICK, "log.tensorboard=false", "train.target_exact_match=null"])
    train_run(cfg, run_dir=tmp_path / "straight")
    train_run(cfg, run_dir=tmp_path / "paused", stop_at=30)
    metrics = tmp_path / "paused" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    after = next(i for i, line in enumerate(lines) if '"gauges"' in line and '"step": 20,' in line)
    bad = [{"step": 25, "split": "gauges", "exact": 7.0, "loss": 1.0, "token_accuracy": -5.0},
           {"step": 10 ** 400, "split": "gauges", "exact": 0.9, "loss": 1.0,
            "token_accuracy": 0.99}]
    metrics.write_text("".join(lines[:after + 1] + [json.dumps(b) + "\n" for b in bad] +
                               lines[after + 1:]))
    train_run(None, resume=tmp_path / "paused" / "checkpoints" / "last.pt")
    straight = gauge_lines(tmp_path / "straight")
    resumed = [line for line in gauge_lines(tmp_path / "paused") if 30 < line["step"] <= 50]
    assert [line["forecast"] for line in resumed] == \
        [line["forecast"] for line in straight if line["step"] > 30]
    assert any(line["forecast"] for line in resumed)  # it forecast something to compare


def test_reading_the_gauges_changes_no_number_of_the_run(tmp_path):
    """No random draw, no state: a run's losses are the same with the gauges on and off."""
    losses = {}
    for every in (0, 5):
        run_dir = tmp_path / f"every{every}"
        result = run_cli("train", *QUICK, "train.steps=20", "log.log_every=5",
                         f"log.gauge_every={every}", "--run-dir", run_dir)
        assert result.exit_code == 0, result.stderr
        losses[every] = [r["loss"] for r in read_metrics(run_dir) if r["split"] == "train"]
    assert losses[0] == losses[5] and len(losses[0]) == 4


@pytest.mark.slow  # two sweeps
def test_a_stacked_run_reads_the_gauges_of_its_solo_run(tmp_path):
    """The gauges of each run of a stack (`sweep --stack`) are those of the run alone."""
    grid = [*QUICK, "train.steps=30", "train.eval_every=0", "log.tensorboard=false"]
    for how in ("--stack", "--no-stack"):
        result = run_cli("sweep", *grid, "--seeds", "0..1", how, "--eval-samples", "20",
                         "--out", tmp_path / how)
        assert result.exit_code == 0, result.stdout + result.stderr
    for run in ("seed=0", "seed=1"):
        stacked = gauge_lines(tmp_path / "--stack" / run)
        alone = gauge_lines(tmp_path / "--no-stack" / run)
        assert [line["step"] for line in stacked] == [10, 20, 30]
        for ours, theirs in zip(stacked, alone, strict=True):
            assert ours["token_accuracy"] == theirs["token_accuracy"]
            assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4)

