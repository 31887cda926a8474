"""Head ablation (`minitfm ablate`): switched-off heads, their means, decoding, the command."""

import json

import pytest
import torch

from minitfm.book.attention import MultiHeadAttention
from minitfm.book.metrics import evaluate, predict
from minitfm.book.model import Seq2SeqTransformer, greedy_decode
from minitfm.config import ModelConfig, load_config
from minitfm.errors import shown_path
from minitfm.lab.interpret.ablate import (
    HeadAblation,
    HeadMeans,
    ablate_model,
    attached,
    edited_heads,
    head_means,
)
from minitfm.lab.loaded import load
from minitfm.lab.options import AblateOptions
from minitfm.tasks.base import eval_set, make_batch
from tests.helpers import TINY, assert_clean_error, run_cli
from tests.helpers import train_bare as train

D, H = 16, 4
K = D // H


def identity_projection(mha: MultiHeadAttention) -> MultiHeadAttention:
    """W^O = I, b^O = 0: the layer's output is then the heads concatenated, as they are."""
    with torch.no_grad():
        mha.out_proj.weight.copy_(torch.eye(D))
        mha.out_proj.bias.zero_()
    return mha


def heads_of(out: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B, T, H, K): head h is the slice h*K:(h+1)*K."""
    return out.view(*out.shape[:2], H, K)


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return identity_projection(MultiHeadAttention(D, H)).eval()


# --- the ablation on MultiHeadAttention's hook point ---

def test_zeroed_head_outputs_exactly_zero_before_the_output_projection(mha):
    x = torch.randn(2, 5, D)
    intact, _ = mha(x, x, x)
    off = torch.tensor([False, True, False, False])
    with attached({mha.heads: HeadAblation(off, torch.zeros(H, K))}):
        ablated, _ = mha(x, x, x)
    assert torch.equal(heads_of(ablated)[:, :, 1], torch.zeros(2, 5, K))
    kept = [0, 2, 3]
    assert torch.equal(heads_of(ablated)[:, :, kept], heads_of(intact)[:, :, kept])


def test_mean_ablation_replaces_the_head_with_its_value_at_every_position(mha):
    x, memory = torch.randn(3, 4, D), torch.randn(3, 6, D)
    value = torch.randn(H, K)
    off = torch.tensor([True, False, False, True])
    intact, _ = mha(x, memory, memory)
    with attached({mha.heads: HeadAblation(off, value)}):
        ablated, _ = mha(x, memory, memory)
    for head in (0, 3):
        assert torch.equal(heads_of(ablated)[:, :, head], value[head].expand(3, 4, K))
    assert torch.equal(heads_of(ablated)[:, :, 1:3], heads_of(intact)[:, :, 1:3])


def test_head_means_average_only_the_valid_queries():
    means = HeadMeans()
    heads = torch.arange(12.0).view(2, 1, 3, 2)  # (B=2, H=1, Q=3, K=2)
    valid = torch.tensor([[True, True, False], [True, False, False]])  # (B, Q)
    record = means.recorder("encoder", 0, valid)
    assert record(heads) is heads  # recording changes nothing
    expected = (heads[0, 0, 0] + heads[0, 0, 1] + heads[1, 0, 0]) / 3  # (K,)
    assert means.counts[("encoder", 0)] == 3
    torch.testing.assert_close(means.means()[("encoder", 0)], expected[None])


# --- the ablation in the model ---

def tiny(*overrides: str):
    return load_config(None, [*TINY, "log.tensorboard=false", *overrides])


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """A tiny copy run of 50 steps (not solved: for shapes, equalities and the CLI)."""
    run_dir = tmp_path_factory.mktemp("ablate") / "copy"
    train(tiny("train.steps=50", "train.target_exact_match=null"), run_dir=run_dir)
    return run_dir


def loaded(run_dir):
    """A run's last checkpoint, loaded, and 200 of its held-out pairs."""
    run = load(run_dir / "checkpoints" / "last.pt", device="cpu")
    return run, eval_set(run.task, 200, run.config.task.eval_seed)


def test_head_means_do_not_depend_on_padding(short_run):
    run, pairs = loaded(short_run)
    padded = head_means(run, pairs, batch_size=200)  # lengths 1..6 together
    alone = head_means(run, pairs, batch_size=1)  # no padding at all
    assert padded.keys() == alone.keys() == {("encoder", 0), ("decoder", 0), ("cross", 0)}
    for key, mean in padded.items():
        assert mean.shape == (2, 16)
        torch.testing.assert_close(mean, alone[key], rtol=1e-5, atol=1e-6)


def test_ablating_nothing_gives_the_intact_predictions(short_run):
    run, pairs = loaded(short_run)
    model, task = run.model, run.task
    none_off = HeadAblation(torch.zeros(2, dtype=torch.bool), torch.randn(2, 16))
    edits = {("encoder", 0): none_off, ("decoder", 0): none_off, ("cross", 0): none_off}
    sources = [src for src, _ in pairs]
    with edited_heads(model, edits):
        predictions = predict(model, task, sources, "cpu")
    assert predictions == evaluate(model, task, pairs, "cpu").predictions


def test_ablated_decoding_with_cache_equals_without_and_teacher_forcing(short_run):
    run, pairs = loaded(short_run)
    model, task = run.model, run.task
    means = head_means(run, pairs)
    edits = {("encoder", 0): HeadAblation(torch.tensor([True, False]), means["encoder", 0]),
             ("decoder", 0): HeadAblation(torch.tensor([False, True]), means["decoder", 0]),
             ("cross", 0): HeadAblation(torch.tensor([True, False]), means["cross", 0])}
    vocab, src = task.vocab, make_batch(pairs[:64], task.vocab).src
    with edited_heads(model, edits):
        cached = greedy_decode(model, src, vocab, 8, True)
        uncached = greedy_decode(model, src, vocab, 8, False)
    assert torch.equal(cached, uncached)
    assert not torch.equal(cached, greedy_decode(model, src, vocab, 8))
    tgt_in = torch.cat([torch.full((64, 1), vocab.bos_id), cached[:, :-1]], dim=1)  # (B, L)
    with edited_heads(model, edits):
        forced = model(src, tgt_in).argmax(dim=-1)  # (B, L)
    eos = (cached == vocab.eos_id).long()  # (B, L)
    written = eos.cumsum(dim=1) - eos == 0  # up to the first EOS; PAD after it is not decoded
    assert torch.equal(forced[written], cached[written])


def test_no_hook_is_left_behind_after_an_ablation_even_when_it_raises():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=D, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32)
    model = Seq2SeqTransformer(cfg, 12, 0).eval()
    src, tgt = torch.randint(3, 12, (3, 5)), torch.randint(3, 12, (3, 4))
    before = model(src, tgt)
    off = HeadAblation(torch.tensor([True, False]), torch.zeros(2, D // 2))
    edits = {(kind, layer): off for kind in ("encoder", "decoder", "cross") for layer in (0, 1)}
    with edited_heads(model, edits):
        assert not torch.equal(model(src, tgt), before)
    assert torch.equal(model(src, tgt), before)
    with pytest.raises(RuntimeError, match="stopped"), edited_heads(model, edits):
        assert not torch.equal(model(src, tgt), before)
        raise RuntimeError("stopped")
    assert torch.equal(model(src, tgt), before)
    assert not any(module._forward_hooks for module in model.modules())


# --- a solved model ---

@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A tiny copy model trained for 200 steps (>= 95% exact match, as test_train checks)."""
    run_dir = tmp_path_factory.mktemp("ablate") / "solved"
    train(tiny("train.target_exact_match=null"), run_dir=run_dir)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_every_cross_head_off_drops_a_solved_copy_model_to_near_0(solved, mode):
    run, pairs = loaded(solved)
    baseline, heads, layers = ablate_model(run, pairs, AblateOptions(mode=mode))
    assert baseline.exact_match >= 0.95
    cross = next(row for row in layers if row["kind"] == "cross")  # its one layer, all heads
    assert cross["exact_match"] <= 0.05, cross
    assert cross["drop"] == pytest.approx(baseline.exact_match - cross["exact_match"])
    assert len(heads) == 3 * 2 and len(layers) == 3
    assert max(row["drop"] for row in heads if row["kind"] == "cross") > 0.10


@pytest.mark.slow
def test_ablate_table_marks_the_heads_that_matter(solved):
    result = run_cli("ablate", solved, "--samples", "200", "--threads", "1")
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())  # lines wrap at the terminal's width
    assert "cross-attention" in out and "encoder self-attention" in out and "all heads" in out
    assert " * " in out and "* = a drop of more than 10 points" in out
    assert f"wrote {shown_path(solved / 'ablate' / 'best-step200-zero.png')}" in out
    first, second = result.stdout.splitlines()[:2]  # the headline: two lines, not an escaped \n
    assert first.endswith("held-out sequences") and second.startswith("intact: exact match")


# --- the command ---

def test_ablate_json_schema_and_baseline_equals_eval(short_run):
    result = run_cli("ablate", short_run, "--json", "--samples", "300", "--mode", "mean")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"checkpoint", "step", "samples", "mode", "baseline", "heads",
                           "layers"}
    assert (report["samples"], report["mode"], report["step"]) == (300, "mean", 50)
    evaluated = json.loads(run_cli("eval", short_run, "--json", "--samples", "300").stdout)
    assert report["baseline"] == {"exact_match": evaluated["exact_match"],
                                  "token_accuracy": evaluated["token_accuracy"]}
    assert [(r["kind"], r["layer"], r["head"]) for r in report["heads"]] == [
        (kind, 0, head) for kind in ("encoder", "decoder", "cross") for head in (0, 1)]
    assert [(r["kind"], r["layer"]) for r in report["layers"]] == [
        ("encoder", 0), ("decoder", 0), ("cross", 0)]
    for row in report["heads"] + report["layers"]:
        assert row["drop"] == pytest.approx(report["baseline"]["exact_match"]
                                            - row["exact_match"])
    assert (short_run / "ablate" / "best-step50-mean.png").stat().st_size > 1000


def test_ablate_out_and_a_loose_checkpoint(short_run, tmp_path):
    out = tmp_path / "figures" / "drops.png"
    result = run_cli("ablate", short_run, "--samples", "50", "--out", out)
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loose = tmp_path / "model.pt"
    loose.write_bytes((short_run / "checkpoints" / "last.pt").read_bytes())
    assert run_cli("ablate", loose, "--samples", "50").exit_code == 0
    assert (tmp_path / "model-ablate-step50-zero.png").is_file()


@pytest.mark.parametrize("args, needles", [
    (["--mode", "half"], ["--mode ('half') must be one of zero, mean"]),
    (["--out", "drops.jpg"], ["--out", ".png"]),
    (["--checkpoint", "first"], ["--checkpoint ('first')"]),
])
def test_ablate_refuses_bad_options_in_one_line(short_run, args, needles):
    assert_clean_error(run_cli("ablate", short_run, "--samples", "20", *args), 2, *needles)


def test_ablate_refuses_a_missing_run(tmp_path):
    assert_clean_error(run_cli("ablate", tmp_path / "nope"), 2, "not found")
