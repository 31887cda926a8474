"""`minitfm bench`: how fast minitfm trains and decodes, against torch's own transformer.

- throughput: target tokens/s of a training step (forward + backward + AdamW) of minitfm's
  model and of a same-size `torch.nn.Transformer`, on the same batches, repetitions
  alternated so that machine noise hits both alike;
- model FLOP utilisation: the model's matmul FLOP/s against this machine's peak, measured
  in the same run on one large matmul;
- greedy decoding of 1000 sequences with and without the KV cache;
- peak memory (RSS) of a training run, and with `--solve` the time to solve the default
  config from scratch, for seeds 0, 1 and 2: `minitfm train` as a user runs it, from the
  start of the process to its exit.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import torch
from torch import nn

from minitfm.book.loop import make_optimizer
from minitfm.book.model import Seq2SeqTransformer, build_model, greedy_decode, sequence_loss
from minitfm.book.positions import sinusoids
from minitfm.config import Config, ModelConfig, TrainConfig, load_config
from minitfm.run.memory import peak_rss_mb
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set, make_batch

SOLVE_SEEDS = (0, 1, 2)  # `--solve` trains the default config from scratch with each

# The two sizes compared: the default config, and a larger model on longer sequences.
SETUPS = {
    "default": [],
    "large": ["model.d_model=128", "model.d_ff=512", "task.max_len=64"],
}


class ReferenceTransformer(nn.Module):
    """The same model from `torch.nn.Transformer`: embeddings, positions, output layer alike."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int):
        super().__init__()
        self.pad_id, self.d_model = pad_id, cfg.d_model
        self.embedding = nn.Embedding(vocab_size, cfg.d_model)
        self.register_buffer("positions", sinusoids(cfg.max_len, cfg.d_model), persistent=False)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout,
                                           batch_first=True, norm_first=cfg.norm_first)
        encoder = nn.TransformerEncoder(layer, cfg.n_encoder_layers, nn.LayerNorm(cfg.d_model),
                                        enable_nested_tensor=False)  # a training-only yardstick
        self.transformer = nn.Transformer(
            cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
            cfg.dropout, custom_encoder=encoder, batch_first=True, norm_first=cfg.norm_first)
        self.out = nn.Linear(cfg.d_model, vocab_size)
        if cfg.tie_embeddings:
            self.out.weight = self.embedding.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) * math.sqrt(self.d_model)  # (B, S, D) or (B, T, D)
        return x + self.positions[: tokens.size(1)]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        pad = src == self.pad_id  # (B, S) True = padding, torch's convention
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=causal,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad,
                             tgt_is_causal=True)  # (B, T, D)
        return self.out(h)  # (B, T, V)


@dataclass
class Setup:
    """A config, its task, and fixed batches shared by both models."""

    name: str
    cfg: Config
    batches: list

    @property
    def tokens(self) -> int:
        return sum(b.n_target_tokens for b in self.batches)


def make_setup(name: str, overrides: list[str], n_batches: int, device) -> Setup:
    cfg = load_config(None, overrides)
    task = make_task(cfg.task)
    generator = torch.Generator().manual_seed(0)
    batches = [make_batch(task.sample(cfg.train.batch_size, generator), task.vocab).to(device)
               for _ in range(n_batches)]
    return Setup(name, cfg, batches)


def build(kind: str, setup: Setup, device, compile_: bool = False):
    """A model of `kind` ("minitfm" or "torch") and its optimizer, seeded alike: minitfm's
    own AdamW, or torch's fastest (fused) with the same settings."""
    torch.manual_seed(0)
    task = make_task(setup.cfg.task)
    cls = Seq2SeqTransformer if kind == "minitfm" else ReferenceTransformer
    model = cls(setup.cfg.model, len(task.vocab), task.vocab.pad_id).to(device).train()
    make = make_optimizer if kind == "minitfm" else torch_adamw
    optimizer = make(model, setup.cfg.train)
    step_model = torch.compile(model) if compile_ else model
    return step_model, optimizer, task.vocab.pad_id


def torch_adamw(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """torch.optim.AdamW as minitfm's: decay on matrices only, betas (0.9, 0.98), fused."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), fused=True)


def timed_step(model, optimizer, pad_id: int, batch, device) -> float:
    """Seconds for one training step (forward, backward, AdamW) on `batch`."""
    sync(device)
    start = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    loss = sequence_loss(logits, batch.tgt_out, pad_id)
    optimizer.zero_grad()  # torch's sets the gradients to None, as minitfm's
    loss.backward()
    optimizer.step()
    sync(device)
    return time.perf_counter() - start


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(setup: Setup, device, reps: int, compile_: bool = False) -> dict:
    """Median target tokens/s of both models over `reps` passes through the batches.

    The models take turns pass by pass, and swap who goes first each time, so that the drift
    of a shared machine's speed hits both alike. A pass of several steps keeps each model's
    own rhythm of allocations, as in a real run (turns every step mix them up and slow both).
    """
    runs = {kind: build(kind, setup, device, compile_) for kind in ("minitfm", "torch")}
    for _ in range(2):  # warm-up: allocator, caches, oneDNN kernels, compilation
        for run in runs.values():
            run_pass(*run, setup.batches, device)
    seconds = {kind: [] for kind in runs}
    order = list(runs)
    for _ in range(reps):
        for kind in order:
            seconds[kind].append(run_pass(*runs[kind], setup.batches, device))
        order.reverse()
    rates = {kind: setup.tokens / median(s) for kind, s in seconds.items()}
    flops = training_flops(setup) / median(seconds["minitfm"])
    return {"setup": setup.name + (" compiled" if compile_ else ""),
            "minitfm_tokens_per_s": rates["minitfm"], "torch_tokens_per_s": rates["torch"],
            "ratio": rates["minitfm"] / rates["torch"], "minitfm_flops_per_s": flops}


def run_pass(model, optimizer, pad_id: int, batches, device) -> float:
    """Seconds for one training step on each batch."""
    return sum(timed_step(model, optimizer, pad_id, batch, device) for batch in batches)


def training_flops(setup: Setup) -> float:
    """Matmul FLOPs of the training steps on the batches: 3x the forward pass (fwd + bwd)."""
    m = setup.cfg.model
    D, F_, V = m.d_model, m.d_ff, len(make_task(setup.cfg.task).vocab)
    total = 0
    for batch in setup.batches:
        (B, S), T = batch.src.shape, batch.tgt_in.size(1)
        encoder = B * (2 * S * 4 * D * D + 4 * S * S * D + 4 * S * D * F_)
        decoder = B * (2 * T * 4 * D * D + 4 * T * T * D  # self-attention
                       + 2 * T * 2 * D * D + 2 * S * 2 * D * D + 4 * T * S * D  # cross
                       + 4 * T * D * F_)
        total += m.n_encoder_layers * encoder + m.n_decoder_layers * decoder + 2 * B * T * D * V
    return 3.0 * total


def peak_matmul_flops(device, dtype=torch.float32) -> float:
    """FLOP/s of the best of a few large square matmuls: the hardware's practical peak."""
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def decoding(length: int, device, n: int = 1000) -> dict:
    """Greedy-decode `n` sources of `length` tokens with and without the KV cache.

    An untrained model decodes until the length cap unless it happens to emit EOS, so the
    decoded length is reported alongside; both paths always produce the same tokens.
    """
    cfg = load_config(None, [f"task.min_len={length}", f"task.max_len={length}"])
    task = make_task(cfg.task)
    torch.manual_seed(0)
    model = build_model(cfg, task).to(device).eval()
    src = make_batch(eval_set(task, n, 0), task.vocab).src.to(device)
    times, outputs = {}, {}
    for use_cache in (True, False):
        sync(device)
        start = time.perf_counter()
        outputs[use_cache] = greedy_decode(model, src, task.vocab.bos_id, task.vocab.eos_id,
                                           length + 1, use_cache=use_cache)
        sync(device)
        times[use_cache] = time.perf_counter() - start
    assert torch.equal(outputs[True], outputs[False]), "KV cache changed the decoded tokens"
    return {"length": length, "sequences": n, "decoded_len": outputs[True].size(1),
            "cached_s": times[True], "uncached_s": times[False],
            "speedup": times[False] / times[True]}


def eval_speed(device) -> dict:
    """`minitfm eval`-style evaluation (greedy decoding + loss) of 1000 default sequences."""
    from minitfm.book.metrics import evaluate

    cfg = load_config()
    task = make_task(cfg.task)
    torch.manual_seed(0)
    model = build_model(cfg, task).to(device)
    pairs = eval_set(task, 1000, cfg.task.eval_seed)
    start = time.perf_counter()
    evaluate(model, task, pairs, device)
    return {"sequences": 1000, "seconds": time.perf_counter() - start}


def train_subprocess(overrides: list[str]) -> dict:
    """Run `minitfm train` in a fresh process: wall seconds, peak RSS, steps to 99%.

    The peak is the child's own VmHWM, read while it runs (the last reading before it exits);
    getrusage's peak for children would include this bench process's memory from the fork.
    """
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "minitfm", "train", *overrides, "--run-dir", str(run_dir)]
        start = time.perf_counter()
        peak = None
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) as proc:
            while proc.poll() is None:
                peak = peak_rss_mb(proc.pid) or peak
                time.sleep(0.02)
            stderr = proc.stderr.read()
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"training subprocess failed: {stderr.strip()[-300:]}")
        return {"wall_s": wall, "peak_rss_mb": peak, **solve_step(run_dir / "metrics.jsonl")}


def solve_step(metrics: Path, target: float = 0.99) -> dict:
    """The first eval step at or above `target` exact match, and the final exact match."""
    import json

    evals = [r for r in map(json.loads, metrics.open()) if r["split"] == "eval"]
    solved = next((r["step"] for r in evals if r["exact_match"] >= target), None)
    return {"steps_to_99": solved, "exact_match": evals[-1]["exact_match"],
            "steps": evals[-1]["step"]}


def run_bench(quick: bool = False, solve: bool = False, compile_: bool = False,
              device: str = "auto") -> dict:
    """Every measurement, as one JSON-ready dict."""
    from minitfm.run.devices import pick_device

    dev = pick_device(device)
    reps, n_batches = (2, 3) if quick else (5, 10)
    report = {"device": str(dev), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "quick": quick, "throughput": []}
    report["peak_flops_per_s"] = peak_matmul_flops(dev)
    setups = {"default": SETUPS["default"]} if quick else SETUPS
    for name, overrides in setups.items():
        setup = make_setup(name, overrides, n_batches, dev)
        variants = [False, True] if compile_ else [False]
        for compiled in variants:
            row = throughput(setup, dev, reps, compiled)
            row["mfu"] = row.pop("minitfm_flops_per_s") / report["peak_flops_per_s"]
            report["throughput"].append(row)
    report["decoding"] = [decoding(n, dev, 200 if quick else 1000) for n in (16, 32)]
    report["eval"] = eval_speed(dev)
    # The child trains with this process's threads: on `auto` it would count this (idle,
    # waiting) process as a neighbour and take half the cores.
    same = f"threads={report['threads']}"
    if solve:  # the whole process, start to exit, as a user runs it
        report["solve"] = [{"seed": seed, **train_subprocess([same, f"seed={seed}"])}
                           for seed in SOLVE_SEEDS]
    else:
        steps = "train.steps=20" if quick else "train.steps=200"
        report["memory"] = train_subprocess([steps, "train.eval_every=0", same])
    return report
