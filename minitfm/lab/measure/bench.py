"""`minitfm bench`: how fast minitfm trains and decodes, against torch's own transformer.

- throughput: target tokens/s of a training step (forward + backward + AdamW) of minitfm's
  model (the speed appendix installed, `model.code=fast`), of the book's own code
  (`model.code=book`) and of a same-size `torch.nn.Transformer`, on the same batches,
  repetitions alternated so that machine noise hits them alike;
- model FLOP utilisation: the model's matmul FLOP/s against this machine's peak, measured
  in the same run on one large matmul;
- greedy decoding of 1000 sequences with and without the KV cache;
- with `--stacks 1,16,64,256`, runs a minute of whole sweeps of the default config, K seeds
  as one stacked model against one run at a time (`stacked_sweeps`);
- peak memory (RSS) of a training run, and with `--solve` the time to solve the default
  config from scratch, for seeds 0, 1 and 2: `minitfm train` as a user runs it, from the
  start of the process to its exit; and, timed the same way, two plain reference trainers
  of the same size and recipe (`reference.py`: nn.Transformer, and x-transformers
  when installed), with the ratio of their median time to minitfm's.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import torch

from minitfm.book.loop import make_optimizer
from minitfm.book.model import greedy_decode, sequence_loss
from minitfm.config import Config, load_config
from minitfm.fast.model import CODES, build_model
from minitfm.lab.child_process import python_module
from minitfm.lab.measure.reference import (
    TRAINERS,
    XT_MISSING,
    ReferenceTransformer,
    import_xtransformers,
    torch_adamw,
)
from minitfm.run.memory import peak_rss_mb
from minitfm.run.rundir import open_run_file
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set, make_batch

REFERENCE_ENTRY = "minitfm.app.reference"  # prints a reference trainer's report as one line
SOLVE_SEEDS = (0, 1, 2)  # `--solve` trains the default config from scratch with each

# The sizes compared: the default config, and a larger model on longer sequences; on a GPU also
# one that keeps it busy (a toy model leaves a GPU mostly waiting for the CPU to launch work).
SETUPS = {
    "default": [],
    "large": ["model.d_model=128", "model.d_ff=512", "task.max_len=64"],
}
GPU_SETUP = ["model.d_model=512", "model.n_heads=8", "model.d_ff=2048", "model.n_encoder_layers=6",
             "model.n_decoder_layers=6", "train.batch_size=256", "task.max_len=64"]


def setups_for(quick: bool, gpu: bool) -> dict[str, list[str]]:
    """The sizes measured: the default alone with --quick; the "gpu" size on a GPU only."""
    if quick:
        return {"default": SETUPS["default"]}
    return {**SETUPS, "gpu": GPU_SETUP} if gpu else dict(SETUPS)


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
    """A model of `kind` and its optimizer, seeded alike: "minitfm" (the fast code) or "book"
    (the book's own code) with minitfm's AdamW, "torch" with torch's fastest (fused) AdamW."""
    torch.manual_seed(0)
    task = make_task(setup.cfg.task)
    cls = {"minitfm": CODES["fast"], "book": CODES["book"], "torch": ReferenceTransformer}[kind]
    model = cls(setup.cfg.model, len(task.vocab), task.vocab.pad_id).to(device).train()
    make = torch_adamw if kind == "torch" else make_optimizer
    optimizer = make(model, setup.cfg.train)
    step_model = torch.compile(model) if compile_ else model
    return step_model, optimizer, task.vocab.pad_id


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
    """Median target tokens/s of each model over `reps` passes through the batches.

    The models take turns pass by pass, and reverse their order each time, so that the drift
    of a shared machine's speed hits them alike. A pass of several steps keeps each model's
    own rhythm of allocations, as in a real run (turns every step mix them up and slow all).
    """
    runs = {kind: build(kind, setup, device, compile_) for kind in ("minitfm", "book", "torch")}
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
            "ratio": rates["minitfm"] / rates["torch"], "minitfm_flops_per_s": flops,
            "book_tokens_per_s": rates["book"], "book_ratio": rates["book"] / rates["minitfm"]}


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
        outputs[use_cache] = greedy_decode(model, src, task.vocab, length + 1, use_cache)
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


def timed_process(cmd: list[str]) -> tuple[float, float | None, str]:
    """Run `cmd` in a fresh process: wall seconds from start to exit, peak RSS (MB), stdout.

    The peak is the child's own VmHWM, read while it runs (the last reading before it exits);
    getrusage's peak for children would include this bench process's memory from the fork.
    Its output goes to files, not pipes: a pipe nobody reads until the end could fill and stall.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        peak = None
        with subprocess.Popen(cmd, stdout=out, stderr=err, text=True) as proc:
            while proc.poll() is None:
                peak = peak_rss_mb(proc.pid) or peak
                time.sleep(0.02)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"training subprocess failed: {err.read().strip()[-300:]}")
        return wall, peak, out.read()


def train_subprocess(overrides: list[str]) -> dict:
    """Run `minitfm train` in a fresh process: wall seconds, peak RSS, steps to 99%."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [*python_module("minitfm"), "train", *overrides, "--run-dir", str(run_dir)]
        wall, peak, _ = timed_process(cmd)
        return {"wall_s": wall, "peak_rss_mb": peak, **solve_step(run_dir / "metrics.jsonl")}


def reference_subprocess(trainer: str, overrides: list[str]) -> dict:
    """Run a plain reference trainer (`reference.py`, through its entry point `app/reference.py`)
    in a fresh process, timed as `train_subprocess` times minitfm: wall seconds, peak RSS, steps
    to the target."""
    cmd = [*python_module(REFERENCE_ENTRY), trainer, *overrides]
    wall, peak, out = timed_process(cmd)
    result = json.loads(out.strip().splitlines()[-1])
    return {"wall_s": wall, "peak_rss_mb": peak, "steps_to_target": result["steps_to_target"],
            "exact_match": result["exact_match"], "steps": result["steps"]}


def solve_runs(overrides: list[str]) -> dict:
    """Time to solve the default config from scratch, seed by seed: minitfm's whole run, then
    each plain reference trainer in turn (a drift of the machine's speed hits all alike).

    Returns the bench report's `solve` (minitfm's runs), `solve_median_wall_s` and
    `solve_reference`: per reference its runs, median wall and the ratio of that median to
    minitfm's (above 1: minitfm is faster), or a `skipped` note when it is not installed.
    """
    skipped = {} if import_xtransformers() is not None else {"x-transformers": XT_MISSING}
    trainers = [t for t in TRAINERS if t not in skipped]
    runs: dict[str, list] = {name: [] for name in ["minitfm", *trainers]}
    for seed in SOLVE_SEEDS:
        seeded = [*overrides, f"seed={seed}"]
        runs["minitfm"].append({"seed": seed, **train_subprocess(seeded)})
        for trainer in trainers:
            runs[trainer].append({"seed": seed, **reference_subprocess(trainer, seeded)})
    ours = median(run["wall_s"] for run in runs["minitfm"])
    references = {}
    for trainer in TRAINERS:
        if trainer in skipped:
            references[trainer] = {"skipped": skipped[trainer]}
            continue
        wall = median(run["wall_s"] for run in runs[trainer])
        references[trainer] = {"runs": runs[trainer], "median_wall_s": wall,
                               "ratio": wall / ours}
    return {"solve": runs["minitfm"], "solve_median_wall_s": ours,
            "solve_reference": references}


def solve_step(metrics: Path, target: float = 0.99) -> dict:
    """The first eval step at or above `target` exact match, and the final exact match."""
    with open_run_file(metrics, "r") as f:
        evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
    solved = next((r["step"] for r in evals if r["exact_match"] >= target), None)
    return {"steps_to_99": solved, "exact_match": evals[-1]["exact_match"],
            "steps": evals[-1]["step"]}


def stacked_sweeps(sizes: list[int], device, threads: int, quick: bool) -> list[dict]:
    """Runs a minute of whole sweeps of the default config (`minitfm sweep --seeds 0..K-1`,
    from start to exit: training, evaluation and every run directory): K seeds as one stack
    (`--stack`, one job), for each K of `sizes`; K = 1 is one run at a time. With `quick`, runs
    of 20 steps."""
    shorter = ["train.steps=20", "train.eval_every=0", "train.warmup_steps=2"] if quick else []
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [*python_module("minitfm"), "sweep", *shorter,
                   f"device={device.type}", "--seeds", f"0..{size - 1}", "--jobs", "1",
                   "--threads", str(threads), "--out", str(Path(tmp) / "sweep"),
                   "--stack" if size > 1 else "--no-stack"]
            wall, peak, _ = timed_process(cmd)
            folder = Path(tmp) / "sweep"
            ended = sum(1 for line in open_run_file(folder / "results.jsonl", "r")
                        if json.loads(line)["status"] in ("finished", "stopped at target"))
        rows.append({"runs": size, "wall_s": wall, "runs_per_minute": 60 * size / wall,
                     "ended": ended, "peak_rss_mb": peak})
    one = rows[0]["runs_per_minute"] if rows and rows[0]["runs"] == 1 else None
    for row in rows:
        row["against_one_at_a_time"] = row["runs_per_minute"] / one if one else None
    return rows


def run_bench(quick: bool = False, solve: bool = False, compile_: bool = False,
              device: str = "auto", stacks: list[int] = ()) -> dict:
    """Every measurement, as one JSON-ready dict."""
    from minitfm.run.devices import pick_device

    dev = pick_device(device)
    reps, n_batches = (2, 3) if quick else (5, 10)
    report = {"device": str(dev), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "quick": quick, "throughput": []}
    # The peak in the dtype the steps compute in: bfloat16 autocast on CUDA, float32 on a CPU.
    report["peak_dtype"] = "bfloat16" if dev.type == "cuda" else "float32"
    report["peak_flops_per_s"] = peak_matmul_flops(dev, getattr(torch, report["peak_dtype"]))
    for name, overrides in setups_for(quick, gpu=dev.type == "cuda").items():
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
    if stacks:
        report["stacks"] = stacked_sweeps(list(stacks), dev, report["threads"], quick)
    if solve:  # the whole process, start to exit, as a user runs it; and plain trainers
        report.update(solve_runs([same]))
    else:
        steps = "train.steps=20" if quick else "train.steps=200"
        report["memory"] = train_subprocess([steps, "train.eval_every=0", same])
    return report
