"""Attention over training: attention.jsonl at every evaluation, entropy, and
`minitfm visualize-attention --over-training` (PNG strip, GIF, errors)."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from minitfm.app.api import train_run as train  # with TensorBoard and the attention recorder
from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import load_config
from minitfm.errors import shown_path
from minitfm.lab.attention.over_training import MAX_COLUMNS, pick_layer, shown_columns, strip_figure
from minitfm.lab.attention.probe import attention_entropy
from minitfm.lab.attention.timeline import ATTENTION_FILE, AttentionRecorder, read_timeline
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set
from tests.helpers import QUICK, assert_clean_error, run_cli

EVALS = [25, 50]
LAYERS, HEADS = 2, 2


def quick(*overrides: str):
    """QUICK (50 steps) with the default attention settings, two decoder layers, an
    evaluation every 25 steps, no TensorBoard."""
    default_attention = [item for item in QUICK if not item.startswith("log.attention_every")]
    return load_config(None, [*default_attention, "model.n_decoder_layers=2",
                              "train.eval_every=25", "train.target_exact_match=null",
                              "log.tensorboard=false", *overrides])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("timeline") / "copy"
    train(quick(), run_dir=run_dir)
    return run_dir


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / ATTENTION_FILE).read_text().splitlines()]


# --- recording ---

def test_a_record_at_every_evaluation_by_default_with_its_shapes(run):
    lines = records(run)
    assert [r["step"] for r in lines] == EVALS  # the end (step 50) is not doubled
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    exact = {r["step"]: r["exact_match"] for r in evals if r["split"] == "eval"}
    for r in lines:
        assert r["exact_match"] == exact[r["step"]]
        assert r["decoder_input"][0] == "<bos>" and r["decoder_input"][1:] == r["source"]  # copy
        assert r["input"] == r["target"] == " ".join(r["source"])
        maps = np.array(r["cross"])
        assert maps.shape == (LAYERS, HEADS, len(r["decoder_input"]), len(r["source"]))
        assert np.allclose(maps.sum(-1), 1.0, atol=0.01)  # rows of weights, 3 decimals each
        assert np.array(r["alignment"]).shape == np.array(r["entropy"]).shape == (LAYERS, HEADS)
        assert all(0 <= e <= math.log(len(r["source"])) + 1e-3 for e in np.ravel(r["entropy"]))
    first, last = (np.array(lines[i]["alignment"]) for i in (0, -1))
    assert last.max() > first.max()  # the copy heads align as the model learns


def test_recording_off_writes_nothing_and_the_strip_says_how_to_get_it(tmp_path):
    run_dir = tmp_path / "off"
    train(quick("train.steps=25", "log.attention_record=false"), run_dir=run_dir)
    assert not (run_dir / ATTENTION_FILE).exists()
    result = run_cli("visualize-attention", run_dir, "--over-training")
    assert_clean_error(result, 2, "no recorded attention", "log.attention_record=true",
                       "log.attention_every=eval")


def test_entropy_of_known_distributions():
    uniform = torch.full((1, 1, 3, 5), 1 / 5)
    one_hot = torch.zeros(1, 1, 3, 5)
    one_hot[..., 2] = 1.0
    padded = torch.tensor([[[[0.5, 0.5, 0.0, 0.0]]]])  # two real keys, two PAD keys at 0
    valid = torch.ones(1, 3, dtype=torch.bool)
    entropy = attention_entropy(torch.cat([uniform, one_hot], dim=1), valid)  # (H=2,)
    assert entropy.tolist() == pytest.approx([math.log(5), 0.0], abs=1e-6)
    assert attention_entropy(padded, torch.ones(1, 1, dtype=torch.bool)).item() == \
        pytest.approx(math.log(2))
    # Only the valid rows count: a uniform row and a one-hot row, the one-hot row skipped.
    mixed = torch.cat([uniform[:, :, :1], one_hot[:, :, :1]], dim=2)  # (1, 1, 2, 5)
    assert attention_entropy(mixed, torch.tensor([[True, False]])).item() == \
        pytest.approx(math.log(5))


def test_a_task_without_an_ideal_alignment_records_entropy_and_maps_only(tmp_path):
    cfg = load_config(None, ["task.name=add", "model.d_model=16", "model.d_ff=32",
                             "model.n_heads=2"])
    task = make_task(cfg.task)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id)
    recorder = AttentionRecorder(task, eval_set(task, 20, 0), tmp_path / ATTENTION_FILE, True)
    snapshot = recorder.take(7, model)
    assert snapshot.alignment is None and snapshot.entropy.shape == (2, 2)
    assert recorder.take(7, model) is snapshot  # one snapshot per step
    recorder.write(snapshot)
    (line,) = records(tmp_path)
    assert line["alignment"] is None and np.array(line["entropy"]).shape == (2, 2)
    assert np.array(line["cross"]).shape[:2] == (2, 2)
    assert pick_layer(read_timeline(tmp_path), None)[0] == 1  # the last layer


def test_resumed_records_replace_a_step_and_a_torn_line_is_skipped(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    again = {**records(run)[0], "exact_match": 0.5}
    with open(copy / ATTENTION_FILE, "a") as f:
        f.write(json.dumps(again) + "\n" + '{"step": 75, "cro')
    timeline = read_timeline(copy)
    assert timeline.steps == EVALS and timeline.exact_match[0] == 0.5


# --- the strip and the GIF ---

def test_strip_has_a_column_per_evaluation_and_a_row_per_head(run):
    timeline = read_timeline(run)
    layer, why = pick_layer(timeline, None)
    final = timeline.alignment[-1]
    assert final[layer].max() == final.max() and f"layer {layer}" in why
    fig = strip_figure(timeline, layer, why)
    panels = [ax for ax in fig.get_axes() if ax.images]
    assert len(panels) == HEADS * len(EVALS)
    titles = [ax.get_title() for ax in panels[:len(EVALS)]]  # the top row, left to right
    assert [t.split("\n")[0] for t in titles] == [f"step {s}" for s in EVALS]
    assert all("exact match" in t and "align" in t and "H " in t for t in titles)
    assert why in fig._suptitle.get_text().replace("\n", " ")


@pytest.mark.parametrize("n_steps", [1, 30])
def test_every_title_and_label_of_the_strip_lies_inside_it(run, n_steps):
    from dataclasses import replace

    from tests.lab.attention.test_viz import texts_outside

    timeline = read_timeline(run)
    index = [i % len(EVALS) for i in range(n_steps)]  # one snapshot, or more than fit
    many = replace(timeline, steps=list(range(n_steps)), exact_match=[0.5] * n_steps,
                   alignment=timeline.alignment[index], entropy=timeline.entropy[index],
                   cross=timeline.cross[index])
    fig = strip_figure(many, 1, pick_layer(many, 1)[1])
    assert texts_outside(fig) == []
    panels = [ax for ax in fig.get_axes() if ax.images]
    assert len(panels) == HEADS * min(n_steps, MAX_COLUMNS)
    # every row of heads carries its source tokens, and both axes say what they are
    assert all([t.get_text() for t in ax.get_xticklabels()] == many.source for ax in panels)
    assert "query: decoder input" in panels[0].get_ylabel()
    assert "key: source token" in fig._supxlabel.get_text()


def test_many_recorded_steps_are_spread_over_the_columns():
    assert shown_columns(3) == [0, 1, 2]
    many = shown_columns(40)
    assert len(many) == MAX_COLUMNS and many[0] == 0 and many[-1] == 39


def test_cli_writes_the_strip_and_a_gif_with_a_frame_per_evaluation(run, tmp_path):
    gif = tmp_path / "sub" / "over.gif"
    result = run_cli("visualize-attention", run, "--over-training", "--gif", gif)
    assert result.exit_code == 0, result.stderr
    layer = pick_layer(read_timeline(run), None)[0]
    png = run / "attention" / f"over-training-layer{layer}.png"
    assert f"wrote {shown_path(png)}" in result.stdout
    assert f"wrote {shown_path(gif)}" in result.stdout
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 300
    with Image.open(gif) as image:
        assert image.format == "GIF" and image.n_frames == len(EVALS)
    for needle in ("step", "exact match", "head 1", "alignment score · entropy"):
        assert needle in result.stdout, needle


def test_cli_layer_and_out(run, tmp_path):
    out = tmp_path / "strip.png"
    result = run_cli("visualize-attention", run, "--over-training", "--layer", "0",
                     "--out", out)
    assert result.exit_code == 0, result.stderr
    assert out.is_file() and "layer 0 (--layer)" in result.stdout


@pytest.mark.parametrize("args,needles", [
    (["--over-training", "--input", "1 2"], ["--over-training cannot", "--input"]),
    (["--over-training", "--kind", "encoder", "--head", "0"], ["--kind, --head"]),
    (["--over-training", "--no-terminal"], ["--no-terminal"]),
    (["--over-training", "--checkpoint", "last"], ["--checkpoint"]),
    (["--over-training", "--threads", "1"], ["--threads"]),
    (["--gif", "a.gif"], ["--gif needs --over-training"]),
    (["--over-training", "--gif", "a.png"], ["--gif ('a.png')", ".gif"]),
    (["--over-training", "--out", "a.gif"], ["--out ('a.gif')", ".png"]),
    (["--over-training", "--layer", "2"], ["--layer (2)", "0..1"]),
])
def test_cli_over_training_refusals_are_one_clean_line(run, args, needles):
    assert_clean_error(run_cli("visualize-attention", run, *args), 2, *needles)


def test_cli_over_training_of_a_loose_checkpoint(run, tmp_path):
    loose = tmp_path / "model.pt"
    shutil.copy(run / "checkpoints" / "last.pt", loose)
    result = run_cli("visualize-attention", loose, "--over-training")
    assert_clean_error(result, 2, "not inside a minitfm run", "attention.jsonl")
