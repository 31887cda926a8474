"""`minitfm bench --quick`: every figure is there and sane (no timing is asserted)."""

import ctypes
import importlib.util
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from minitfm.app import reference as reference_entry
from minitfm.book.metrics import strip_eos
from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import ModelConfig, load_config
from minitfm.errors import MinitfmError
from minitfm.lab.measure import reference
from minitfm.lab.measure.bench import (
    ReferenceTransformer,
    build,
    make_setup,
    reference_subprocess,
    setups_for,
    solve_step,
    train_subprocess,
    training_flops,
)
from minitfm.lab.measure.reference import TRAINERS
from minitfm.run.memory import peak_rss_mb
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set
from tests.helpers import TINY, assert_clean_error, missing, once, run_cli


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
    from minitfm.lab.measure.bench import Setup
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
    assert row["book_ratio"] == pytest.approx(
        row["book_tokens_per_s"] / row["minitfm_tokens_per_s"], rel=1e-12)
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
    # On the CPU: a CUDA child holds the CUDA runtime too (1.4 GB measured on an H100 machine).
    run = train_subprocess(once([*TINY, "train.steps=5", "train.eval_every=0", "device=cpu"]))
    assert 50 < run["peak_rss_mb"] < 1024
    del ballast


@pytest.mark.parametrize("load, warned", [(99.0, True), (0.5, False)])
def test_bench_warns_in_one_line_when_the_machine_is_busy(monkeypatch, load, warned):
    import minitfm.lab.measure.bench
    import minitfm.run.threads

    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(minitfm.run.threads, "cores", lambda: 2)
    monkeypatch.setattr(minitfm.lab.measure.bench, "run_bench", lambda **_: {"device": "cpu"})
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
print(kept, held.hblks - before.hblks, held.uordblks - before.uordblks, held.arena, after.arena)
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
    _, mapped, *_ = malloc_trial("plain")
    assert mapped == "1"
    # With it, the settings took effect: the block comes from the heap (the heap's bytes in use
    # grew by it), and the heap keeps it after the free (not trimmed), ready for the next step's
    # same-sized block. (How much the arena itself grew depends on what imports left free.)
    kept, mapped, in_use, arena, after = malloc_trial("keep")
    assert kept == "True" and mapped == "0"
    assert int(in_use) >= 24 * 2**20 and int(after) == int(arena)


# --- the plain reference trainers of `bench --solve` (minitfm.lab.measure.reference) ---

TINY_REFERENCE = ["train.steps=4", "train.eval_every=2", "task.max_len=4", "model.d_model=16",
                  "model.n_heads=2", "model.d_ff=32", "train.batch_size=8",
                  "train.eval_samples=10", "threads=1", "device=cpu"]
NEEDS_XT = "x-transformers is an optional extra (pip install -e '.[bench]')"


def needs(trainer: str) -> None:
    """Skip (with the reason) a test of the x-transformers trainer when it is not installed;
    under MINITFM_CI=1 fail (.ci/run installs the bench extra)."""
    if trainer == "x-transformers" and importlib.util.find_spec("x_transformers") is None:
        missing(NEEDS_XT)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_reference_trainer_trains_and_evaluates_on_schedule(trainer, monkeypatch):
    needs(trainer)
    evaluations = []  # (pairs decoded, exact match) of each evaluation of the trainer's model
    real = reference.exact_match

    def recorded(ref, task, pairs, device):
        evaluations.append((len(pairs), real(ref, task, pairs, device)))
        return evaluations[-1][1]

    monkeypatch.setattr(reference, "exact_match", recorded)
    result = reference.run(trainer, TINY_REFERENCE)
    assert result["trainer"] == trainer and result["seed"] == 0
    assert result["steps"] == 4 and result["steps_to_target"] is None  # 4 steps learn nothing
    # evaluated on the 10 held-out pairs after steps 2 and 4 (eval_every=2): the last one is
    # the result (the decoding itself: test_reference_exact_match_compares_decoding_...)
    assert [n for n, _ in evaluations] == [10, 10]
    assert result["exact_match"] == evaluations[-1][1]


@pytest.mark.slow  # starts a Python process per trainer
@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_reference_trainer_prints_its_json_line_in_a_fresh_process(trainer):
    needs(trainer)
    cmd = [sys.executable, "-m", "minitfm.app.reference", trainer, *TINY_REFERENCE, "seed=3"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert len(out.splitlines()) == 1
    result = json.loads(out)
    assert set(result) == {"trainer", "seed", "steps_to_target", "steps", "exact_match"}
    assert result["trainer"] == trainer and result["seed"] == 3 and result["steps"] == 4
    timed = reference_subprocess(trainer, TINY_REFERENCE)  # as the bench runs it
    assert timed["wall_s"] > 0 and timed["steps"] == 4


@pytest.mark.slow  # a Python process per seed and trainer (minitfm's own and the references)
def test_solve_runs_times_real_processes_of_every_trainer(monkeypatch):
    """`bench --solve`'s pipeline with its real processes, on a tiny config and one seed (the
    command itself always trains the default config for 3 seeds, minutes: docs/speed.md; the
    medians over seeds are test_bench_tables_... and test_solve_skips_...'s, with fakes)."""
    import minitfm.lab.measure.bench as bench

    monkeypatch.setattr(bench, "SOLVE_SEEDS", (3,))
    installed = bench.import_xtransformers() is not None
    if not installed and os.environ.get("MINITFM_CI") == "1":
        missing(NEEDS_XT)
    report = bench.solve_runs([*TINY_REFERENCE, "log.tensorboard=false"])
    assert [run["seed"] for run in report["solve"]] == list(bench.SOLVE_SEEDS)
    for run in report["solve"]:
        assert run["steps"] == 4 and run["wall_s"] > 0 and run["peak_rss_mb"] > 0
        assert run["steps_to_99"] is None and 0.0 <= run["exact_match"] <= 1.0
    [ours] = [run["wall_s"] for run in report["solve"]]
    assert report["solve_median_wall_s"] == ours
    ran = [t for t in TRAINERS if installed or t != "x-transformers"]
    assert set(report["solve_reference"]) == set(TRAINERS)
    for trainer in ran:
        ref = report["solve_reference"][trainer]
        assert [run["seed"] for run in ref["runs"]] == list(bench.SOLVE_SEEDS)
        assert all(run["steps"] == 4 and run["steps_to_target"] is None for run in ref["runs"])
        assert ref["median_wall_s"] == ref["runs"][0]["wall_s"] > 0
        assert ref["ratio"] == pytest.approx(ref["median_wall_s"] / ours, rel=1e-12)
    if not installed:
        assert report["solve_reference"]["x-transformers"] == {"skipped": bench.XT_MISSING}


def test_an_unknown_reference_trainer_is_one_line_and_exit_2(capsys):
    assert reference_entry.main(["jax"]) == 2
    assert capsys.readouterr().err == "error: trainer ('jax') must be one of torch, " \
                                      "x-transformers\n"


def test_torch_reference_decodes_as_minitfm_recomputing_the_prefix():
    """nn.Transformer's greedy decoding (encoder once, decoder over the prefix) gives the tokens
    of minitfm's uncached greedy decoding on the same weights, and of a full forward per step."""
    from minitfm.book.model import greedy_decode

    ours, ref_model, _ = paired_models(norm_first=True, tie_embeddings=False)
    with torch.no_grad():  # EOS scores 1.1x token 5: some rows end early, at various steps
        ours.generator.weight[2] = ours.generator.weight[5] * 1.1
        ref_model.out.weight[2] = ref_model.out.weight[5] * 1.1
    cfg = load_config(None, ["model.d_model=16", "model.n_heads=2", "model.d_ff=32"])
    ref = reference.TorchReference(cfg, make_task(cfg.task))
    ref.model = ref_model
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0], [10, 3, 4, 0, 0], [5, 5, 0, 0, 0],
                        [7, 0, 0, 0, 0], [6, 4, 3, 9, 0]])  # 0 is PAD
    bos, eos, cap = 1, 2, 8
    mine = [strip_eos(row, eos) for row in
            greedy_decode(ours, src, ref.vocab, cap, use_cache=False).tolist()]
    theirs = [strip_eos(row, eos) for row in ref.decode(src, cap).tolist()]
    tokens = torch.full((len(src), 1), bos)
    with torch.no_grad():
        for _ in range(cap):  # the straightforward way: the whole model at every step
            tokens = torch.cat([tokens, ref_model(src, tokens)[:, -1].argmax(-1)[:, None]], 1)
    plain = [strip_eos(row, eos) for row in tokens[:, 1:].tolist()]
    assert theirs == mine == plain
    ended = [i for i, row in enumerate(theirs) if len(row) < cap]
    assert 0 < len(ended) < len(src)  # some rows emit EOS, others run to the cap
    last = max(len(theirs[i]) for i in ended) + 1  # the step of the last of their EOS
    assert ref.decode(src[ended], cap).size(1) == last < cap  # then decoding stops


def test_reference_exact_match_compares_decoding_never_reads_the_target():
    cfg = load_config(None, TINY_REFERENCE)
    task = make_task(cfg.task)
    torch.manual_seed(0)
    ref = reference.TorchReference(cfg, task)
    pairs = eval_set(task, 20, 0)
    sources = [src for src, _ in pairs]
    predictions = reference.predict(ref, task, sources, torch.device("cpu"))
    cpu = torch.device("cpu")
    # targets chosen from the predictions: all right; each one changed: all wrong
    assert reference.exact_match(ref, task, list(zip(sources, predictions)), cpu) == 1.0
    wrong = [(src, pred + [3]) for src, pred in zip(sources, predictions)]
    assert reference.exact_match(ref, task, wrong, cpu) == 0.0
    expected = sum(p == t for p, (_, t) in zip(predictions, pairs)) / len(pairs)
    assert reference.exact_match(ref, task, pairs, cpu) == expected


def fake_solve(monkeypatch, walls: dict):
    """The bench's solve runs with made-up processes: `walls` = wall seconds by trainer."""
    import minitfm.lab.measure.bench as bench

    def minitfm_run(overrides):
        seed = int(overrides[-1].split("=")[1])
        return {"wall_s": walls["minitfm"][seed], "peak_rss_mb": 300.0, "steps_to_99": 250,
                "exact_match": 0.995, "steps": 250}

    def reference_run(trainer, overrides):
        seed = int(overrides[-1].split("=")[1])
        return {"wall_s": walls[trainer][seed], "peak_rss_mb": 280.0, "steps_to_target": 300,
                "exact_match": 0.991, "steps": 300}

    monkeypatch.setattr(bench, "train_subprocess", minitfm_run)
    monkeypatch.setattr(bench, "reference_subprocess", reference_run)
    return bench.solve_runs(["threads=1"])


def test_solve_skips_x_transformers_with_a_note_when_it_cannot_be_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "x_transformers", None)  # `import x_transformers` fails
    solved = fake_solve(monkeypatch, {"minitfm": [10.0, 12.0, 11.0], "torch": [44.0, 22.0, 33.0]})
    references = solved["solve_reference"]
    assert references["x-transformers"] == {
        "skipped": "x-transformers is not installed (pip install x-transformers)"}
    assert solved["solve_median_wall_s"] == 11.0
    assert references["torch"]["median_wall_s"] == 33.0 and references["torch"]["ratio"] == 3.0
    assert [run["seed"] for run in references["torch"]["runs"]] == [0, 1, 2]
    assert [run["seed"] for run in solved["solve"]] == [0, 1, 2]
    json.dumps(solved)  # JSON-ready
    with pytest.raises(MinitfmError, match=r"^x-transformers is not installed"):
        reference.run("x-transformers", TINY_REFERENCE)


def test_bench_tables_print_a_row_per_trainer_with_the_ratio():
    from rich.console import Console

    from minitfm.app.commands.bench import bench_tables

    runs = [{"seed": s, "wall_s": w, "peak_rss_mb": 300.0, "steps_to_99": st,
             "exact_match": em, "steps": st or 300}
            for s, w, st, em in ((0, 10.0, 250, 0.995), (1, 12.0, 300, 0.992),
                                 (2, 11.0, None, 0.97))]
    ref_runs = [{"seed": s, "wall_s": w, "peak_rss_mb": 280.0, "steps_to_target": 300,
                 "exact_match": 0.991, "steps": 300} for s, w in ((0, 30.0), (1, 27.5), (2, 29.0))]
    report = {"device": "cpu", "threads": 2, "torch": "2.13.0", "peak_flops_per_s": 60e9,
              "throughput": [], "decoding": [], "eval": {"seconds": 0.3}, "solve": runs,
              "solve_median_wall_s": 11.0,
              "solve_reference": {"torch": {"runs": ref_runs, "median_wall_s": 29.0,
                                            "ratio": 29.0 / 11.0},
                                  "x-transformers": {"skipped": "x-transformers is not "
                                                     "installed (pip install x-transformers)"}}}
    console = Console(width=200, record=True)
    for table in bench_tables(report):
        console.print(table)
    text = console.export_text()
    torch_row = next(line for line in text.splitlines() if "│ torch" in line)
    assert "30.0 / 27.5 / 29.0" in torch_row and "minitfm is 2.6x faster" in torch_row
    assert "99.1% / 99.1% / 99.1%" in torch_row
    minitfm_row = next(line for line in text.splitlines() if "│ minitfm" in line)
    assert "10.0 / 12.0 / 11.0" in minitfm_row and "250 / 300 / -" in minitfm_row
    assert "skipped: x-transformers is not installed" in " ".join(text.split())
    report["solve_reference"]["torch"]["ratio"] = 0.5
    console = Console(width=200, record=True)
    console.print(bench_tables(report)[-1])
    assert "minitfm is 2.0x slower" in console.export_text()


@pytest.mark.parametrize("steps, script, expected_calls, expected", [
    # full evaluations every 10 steps; checks every 2 once one reached two thirds of 0.99; a
    # check at the target calls a full evaluation at once, which alone decides
    (40, [0.3, 0.7, 0.5, 0.5, 1.0, 0.98, 1.0, 0.995],
     [(10, "full"), (20, "full"), (22, "check"), (24, "check"), (26, "check"), (26, "full"),
      (28, "check"), (28, "full")],
     {"steps_to_target": 28, "steps": 28, "exact_match": 0.995}),
    # the last step had no evaluation: a final one
    (15, [0.3, 0.4], [(10, "full"), (15, "full")],
     {"steps_to_target": None, "steps": 15, "exact_match": 0.4}),
])
def test_reference_evaluates_on_minitfms_schedule(monkeypatch, steps, script, expected_calls,
                                                  expected):
    from types import SimpleNamespace

    cfg = load_config(None, [*TINY_REFERENCE, "train.eval_every=10", f"train.steps={steps}"])
    train_cfg = SimpleNamespace(**{**cfg.train.model_dump(), "check_every": 2})
    cfg_ns = SimpleNamespace(train=train_cfg, seed=0, task=cfg.task)
    task = make_task(cfg.task)
    step, calls, results = [0], [], iter(script)

    def count_step(*_):
        step[0] += 1

    def scripted(ref, task, pairs, device):
        calls.append((step[0], "full" if len(pairs) == 10 else "check"))
        return next(results)

    monkeypatch.setattr(reference, "train_step", count_step)
    monkeypatch.setattr(reference, "exact_match", scripted)
    ref = SimpleNamespace(model=torch.nn.Linear(2, 2))
    assert reference.train_reference(ref, cfg_ns, task, torch.device("cpu")) == expected
    assert calls == expected_calls


def test_the_bench_times_the_fast_code_as_minitfm_and_the_books_own_beside_it():
    """`minitfm` in the bench is what `minitfm train` runs (model.code=fast); the book's
    readable code is timed as a column of its own, on the same weights."""
    from minitfm.fast.model import FastTransformer

    setup = make_setup("default", ["model.d_model=16", "model.n_heads=2"], 1,
                       torch.device("cpu"))
    fast, book = (build(kind, setup, torch.device("cpu"))[0] for kind in ("minitfm", "book"))
    assert type(fast) is FastTransformer and type(book) is Seq2SeqTransformer
    for a, b in zip(fast.state_dict().values(), book.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_the_gpu_sized_model_is_benched_on_a_gpu_only():
    assert list(setups_for(quick=False, gpu=False)) == ["default", "large"]
    assert list(setups_for(quick=False, gpu=True)) == ["default", "large", "gpu"]
    assert list(setups_for(quick=True, gpu=True)) == ["default"]
    load_config(None, setups_for(quick=False, gpu=True)["gpu"])  # a valid config


@pytest.mark.slow  # two whole sweeps in fresh processes
def test_bench_stacks_times_whole_stacked_sweeps_against_one_run_at_a_time(monkeypatch):
    """--stacks 1,2 (quick: runs of 20 steps): a row per stack size, every run ended, runs a
    minute from the wall time, the ratio against one at a time; the table shows them."""
    from rich.console import Console

    from minitfm.app.commands.bench import stacks_table
    from minitfm.lab.measure.bench import stacked_sweeps

    rows = stacked_sweeps([1, 2], torch.device("cpu"), 1, quick=True)
    assert [(row["runs"], row["ended"]) for row in rows] == [(1, 1), (2, 2)]
    for row in rows:
        assert row["runs_per_minute"] == pytest.approx(60 * row["runs"] / row["wall_s"])
    assert rows[0]["against_one_at_a_time"] == 1.0
    assert rows[1]["against_one_at_a_time"] == pytest.approx(
        rows[1]["runs_per_minute"] / rows[0]["runs_per_minute"])
    console = Console(width=120, record=True)
    console.print(stacks_table({"device": "cpu", "stacks": rows}))
    text = console.export_text()
    assert "runs a minute" in text and "2/2" in text


def test_stack_sizes_are_refused_in_one_line_unless_counts():
    assert_clean_error(run_cli("bench", "--stacks", "1,x"), 2, "--stacks ('1,x') must be")
    assert_clean_error(run_cli("bench", "--stacks", "0"), 2, "from 1 to 4096")
