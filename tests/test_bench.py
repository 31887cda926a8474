"""`minitfm bench --quick`: every figure is there and sane (no timing is asserted)."""

import ctypes
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import ModelConfig, load_config
from minitfm.lab.bench import (
    ReferenceTransformer,
    make_setup,
    solve_step,
    train_subprocess,
    training_flops,
)
from minitfm.run.memory import peak_rss_mb
from tests.helpers import TINY, run_cli


def test_reference_has_the_same_parameter_count_but_torch_extra_final_norms():
    cfg = load_config()
    ours = Seq2SeqTransformer(cfg.model, 13, 0)
    ref = ReferenceTransformer(cfg.model, 13, 0)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # torch's norm_first=False has final norms too; with pre-LN both have two final norms
    assert abs(count(ours) - count(ref)) <= 13  # at most the output bias differs


def paired_parameters(ours: Seq2SeqTransformer, ref: ReferenceTransformer):
    """(our tensors, torch's tensor) for every parameter: q, k, v stacked as in_proj."""
    pairs = [([ours.embedding.weight], ref.embedding.weight),
             ([ours.generator.weight], ref.out.weight)]
    torch_layers = [*ref.transformer.encoder.layers, *ref.transformer.decoder.layers]
    for mine, theirs in zip([*ours.encoder_layers, *ours.decoder_layers], torch_layers,
                            strict=True):
        attentions = [(mine.self_attn, theirs.self_attn)]
        if hasattr(theirs, "multihead_attn"):
            attentions.append((mine.cross_attn, theirs.multihead_attn))
        for a, b in attentions:
            pairs += [([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], b.in_proj_weight),
                      ([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias], b.in_proj_bias),
                      ([a.out_proj.weight], b.out_proj.weight),
                      ([a.out_proj.bias], b.out_proj.bias)]
        modules = ["linear1", "linear2", "norm1", "norm2", "norm3"]
        for name in (m for m in modules if hasattr(theirs, m)):
            mine_module = getattr(mine.feed_forward if "linear" in name else mine, name)
            pairs += [([mine_module.weight], getattr(theirs, name).weight),
                      ([mine_module.bias], getattr(theirs, name).bias)]
    if ours.config.norm_first:  # pre-LN: both stacks end with a LayerNorm
        for mine, theirs in ((ours.encoder_norm, ref.transformer.encoder.norm),
                             (ours.decoder_norm, ref.transformer.decoder.norm)):
            pairs += [([mine.weight], theirs.weight), ([mine.bias], theirs.bias)]
    return pairs


def paired_models(norm_first: bool, tie_embeddings: bool):
    """minitfm's model and torch's `nn.Transformer` holding the same random weights (float64)."""
    cfg = ModelConfig(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32,
                      max_len=16, norm_first=norm_first, tie_embeddings=tie_embeddings)
    torch.manual_seed(0)
    ours = Seq2SeqTransformer(cfg, 11, 0).to(torch.float64)
    ref = ReferenceTransformer(cfg, 11, 0).to(torch.float64)
    if not norm_first:  # post-LN: minitfm's stacks end with their last layer's norm, as the
        ref.transformer.encoder.norm = None  # paper's; torch adds one more LayerNorm
        ref.transformer.decoder.norm = None
    pairs = paired_parameters(ours, ref)
    assert {id(p) for mine, _ in pairs for p in mine} == {id(p) for p in ours.parameters()}
    with torch.no_grad():
        for name, p in ref.named_parameters():  # random gains and shifts: every norm counts
            gain = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(gain + torch.randn_like(p) * 0.3)
        ref.out.bias.zero_()  # minitfm's output projection has no bias
        for mine, theirs in pairs:
            for part, value in zip(mine, theirs.chunk(len(mine)), strict=True):
                part.copy_(value)
    return ours, ref, pairs


@pytest.mark.parametrize("norm_first, tie_embeddings", [(True, True), (False, True),
                                                         (True, False), (False, False)])
@pytest.mark.parametrize("training", [False, True])  # training on a CPU packs the real tokens
def test_whole_model_matches_torchs_transformer_in_logits_and_gradients(
        norm_first, tie_embeddings, training):
    ours, ref, pairs = paired_models(norm_first, tie_embeddings)
    ours.train(training), ref.train(training)  # dropout is 0: only the code path changes
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0], [10, 3, 4, 0, 0]])  # 0 is PAD
    tgt_in = torch.tensor([[1, 5, 6, 7, 8, 9], [1, 4, 4, 0, 0, 0], [1, 10, 0, 0, 0, 0]])
    real = tgt_in != 0  # the logits at target padding feed no loss (and packing skips them)
    logits, expected = ours(src, tgt_in), ref(src, tgt_in)
    torch.testing.assert_close(logits[real], expected[real], rtol=0, atol=1e-10)
    if not training:
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
    g = torch.randn(logits[real].shape, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    (logits[real] * g).sum().backward()
    (expected[real] * g).sum().backward()
    for mine, theirs in pairs:
        torch.testing.assert_close(torch.cat([p.grad for p in mine]), theirs.grad, rtol=0,
                                   atol=1e-10)


def test_training_flops_counts_the_matmuls_by_hand():
    from minitfm.lab.bench import Setup
    from minitfm.tasks.base import Batch

    cfg = load_config(None, ["model.n_encoder_layers=1", "model.n_decoder_layers=1",
                             "model.d_model=8", "model.n_heads=2", "model.d_ff=16"])
    batch = Batch(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long),
                  torch.zeros(1, 3, dtype=torch.long), 3)
    D, F, V, S, T = 8, 16, 13, 2, 3
    enc = 2 * S * 4 * D * D + 4 * S * S * D + 4 * S * D * F
    dec = (2 * T * 4 * D * D + 4 * T * T * D + 2 * T * 2 * D * D + 2 * S * 2 * D * D
           + 4 * T * S * D + 4 * T * D * F)
    assert training_flops(Setup("x", cfg, [batch])) == 3 * (enc + dec + 2 * T * D * V)


def test_solve_step_reads_metrics(tmp_path):
    lines = [{"step": 100, "split": "eval", "exact_match": 0.5},
             {"step": 150, "split": "train", "loss": 0.1},
             {"step": 200, "split": "eval", "exact_match": 0.995}]
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, lines)))
    assert solve_step(tmp_path / "m.jsonl") == {"steps_to_99": 200, "exact_match": 0.995,
                                                "steps": 200}


@pytest.mark.slow
def test_bench_quick_json():
    result = run_cli("bench", "--quick", "--json", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["device"] == "cpu" and report["threads"] >= 1
    assert report["load_average"] >= 0 and report["cores"] >= 1
    assert report["peak_flops_per_s"] > 0
    row = report["throughput"][0]
    assert row["minitfm_tokens_per_s"] > 0 and row["torch_tokens_per_s"] > 0
    assert row["ratio"] > 0 and row["mfu"] > 0
    # Clock-free consistency (the figures are timed at different moments, so an MFU below 1
    # is not guaranteed on a loaded machine): each figure is what the others say it is.
    assert row["ratio"] == pytest.approx(row["minitfm_tokens_per_s"] / row["torch_tokens_per_s"],
                                         rel=1e-12)
    setup = make_setup("default", [], 3, torch.device("cpu"))  # --quick's batches, seeded
    flops_per_token = training_flops(setup) / setup.tokens
    assert row["mfu"] == pytest.approx(
        flops_per_token * row["minitfm_tokens_per_s"] / report["peak_flops_per_s"], rel=1e-9)
    assert {d["length"] for d in report["decoding"]} == {16, 32}
    assert all(d["speedup"] > 0 for d in report["decoding"])
    for d in report["decoding"]:
        assert d["speedup"] == pytest.approx(d["uncached_s"] / d["cached_s"], rel=1e-12)
        assert d["sequences"] == 200 and 1 <= d["decoded_len"] <= d["length"] + 1
    assert report["eval"]["sequences"] == 1000
    assert report["memory"]["peak_rss_mb"] > 0


@pytest.mark.slow
def test_peak_rss_is_the_childs_own_not_this_process():
    # getrusage's peak for children counts the parent's pages from the fork: with 1 GB held
    # here, it would report over 1 GB for a child that never needs it.
    ballast = torch.ones(2**28)  # 1 GiB, touched
    assert peak_rss_mb() > 1024
    run = train_subprocess([*TINY, "train.steps=5", "train.eval_every=0"])
    assert 50 < run["peak_rss_mb"] < 1024
    del ballast


@pytest.mark.parametrize("load, warned", [(99.0, True), (0.5, False)])
def test_bench_warns_in_one_line_when_the_machine_is_busy(monkeypatch, load, warned):
    import minitfm.lab.bench
    import minitfm.run.threads

    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(minitfm.run.threads, "cores", lambda: 2)
    monkeypatch.setattr(minitfm.lab.bench, "run_bench", lambda **_: {"device": "cpu"})
    result = run_cli("bench", "--json", "--threads", "1")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"load_average": load, "cores": 2, "device": "cpu"}
    warning = (f"warning: load average {load:.1f} on 2 cores: other work is running, so these "
               f"figures are not meaningful")
    assert result.stderr.strip() == (warning if warned else "")


def test_peak_rss_of_a_process_that_is_gone_is_none():
    assert peak_rss_mb(2**22 + 12345) is None


# In a fresh process (no torch): one 24 MB block malloc'd and freed, as glibc's mallinfo2 sees
# it: mmap'd blocks (hblks), and heap bytes (arena) while held and after the free.
MALLOC_TRIAL = """
import ctypes, ctypes.util, sys
from minitfm.run.memory import keep_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
block = libc.malloc(24 * 2**20)
held = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
print(kept, held.hblks - before.hblks, held.arena - before.arena, after.arena - before.arena)
"""


def malloc_trial(mode: str) -> list[str]:
    """MALLOC_TRIAL's figures, with glibc's own settings (no MALLOC_* or tunables inherited)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", MALLOC_TRIAL, mode], capture_output=True,
                         text=True, check=True, env=env)
    return out.stdout.split()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc"
                    or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="glibc's mallopt and mallinfo2 (glibc 2.33 or later)")
def test_keep_freed_memory_serves_blocks_from_the_heap_and_keeps_them():
    # Without it, glibc gives a 24 MB block its own mmap, unmapped (and refaulted) each time.
    _, mapped, _, _ = malloc_trial("plain")
    assert mapped == "1"
    # With it, the settings took effect: the block comes from the heap, and the heap keeps it
    # after the free (it is not trimmed), ready for the next step's same-sized block.
    kept, mapped, held, after = malloc_trial("keep")
    assert kept == "True" and mapped == "0"
    assert int(held) >= 24 * 2**20 and int(after) == int(held)
