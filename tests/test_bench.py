"""`minitfm bench --quick`: every figure is there and sane (no timing is asserted)."""

import json
import subprocess
import sys

import pytest
import torch

from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import load_config
from minitfm.lab.bench import ReferenceTransformer, solve_step, train_subprocess, training_flops
from minitfm.run.memory import peak_rss_mb
from tests.helpers import TINY, run_cli


def test_reference_has_the_same_parameter_count_but_torch_extra_final_norms():
    cfg = load_config()
    ours = Seq2SeqTransformer(cfg.model, 13, 0)
    ref = ReferenceTransformer(cfg.model, 13, 0)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # torch's norm_first=False has final norms too; with pre-LN both have two final norms
    assert abs(count(ours) - count(ref)) <= 13  # at most the output bias differs


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
    assert row["ratio"] > 0 and 0 < row["mfu"] < 1
    assert {d["length"] for d in report["decoding"]} == {16, 32}
    assert all(d["speedup"] > 0 for d in report["decoding"])
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


def test_peak_rss_of_a_process_that_is_gone_is_none():
    assert peak_rss_mb(2**22 + 12345) is None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_stops_refaulting_reused_blocks():
    # In a fresh process: a 4 MB tensor made and freed 20 times faults its pages in each time
    # (glibc unmaps it), and not once after keep_freed_memory (the block is reused).
    code = """
import resource, torch
from minitfm.run.memory import keep_freed_memory
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        torch.ones(2**20)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults(), keep_freed_memory(), faults())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    plain, kept, after = out.stdout.split()
    assert kept == "True"
    assert int(plain) > 20 * 200 and int(after) < 50
