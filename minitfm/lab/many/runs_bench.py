"""How long `minitfm runs --where` and `--group-by` take over many run folders: a benchmark,
not a test (`python -m minitfm.lab.many.runs_bench 500`).

It writes N fake run folders in a temporary folder, shaped as the default config's runs (280
steps, a train line every 25, gauges every 10, an evaluation every 100: 45 lines of
metrics.jsonl, config.yaml and summary.json), half of them in sweep folders of 50 runs (each
run with its eval-A-B.json), half on their own; then times each command as a user runs it, a
process from start to exit (Python's start and the imports included), REPEATS times, and
prints the median and the slowest, with the median CPU time and the load average (on a busy
machine the CPU time is nearer what it takes alone). The folders are removed afterwards. No
torch here.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from minitfm.config import load_config, to_yaml
from minitfm.lab.child_process import python_module
from minitfm.lab.many.runs import SWEEP_FILE

REPEATS = 5
SWEEP_SIZE = 50  # runs a sweep folder
POSITIONALS = ("sinusoidal", "rope", "learned", "alibi")
LRS = (0.001, 0.003, 0.005, 0.01)
COMMANDS = (("--where", "train.lr=5e-3"), ("--group-by", "model.positional"),
            ("--where", "train.lr=0.005", "--group-by", "model.positional", "--group-by",
             "train.lr"))


def fake_run(run_dir: Path, i: int, in_sweep: bool) -> None:
    """A finished run of the default shape, its settings drawn from `i`."""
    run_dir.mkdir(parents=True)
    cfg = load_config(None, [f"seed={i % 10}", f"train.lr={LRS[i % len(LRS)]}",
                             f"model.positional={POSITIONALS[(i // len(LRS)) % len(POSITIONALS)]}"])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    exact = 0.5 + (i % 50) / 100
    lines = []
    for step in range(1, cfg.train.steps + 1):
        elapsed = step * 0.05
        if step % 25 == 0:
            lines.append({"step": step, "split": "train", "loss": 1 / step, "tokens_per_s": 9e4,
                          "lr": 1e-3, "grad_norm": 0.5, "elapsed_s": elapsed})
        if step % 10 == 0:
            lines.append({"step": step, "split": "gauges", "exact": exact, "loss": 1 / step,
                          "token_accuracy": 0.9, "positions": [0.9] * 16, "hard_loss": 0.2,
                          "align": 0.7, "coverage": 0.8, "heads": [[0.5] * 4] * 2,
                          "weight_norm": 25.0, "forecast": None})
        if step % 100 == 0 or step == cfg.train.steps:
            lines.append({"step": step, "split": "eval", "loss": 1 / step,
                          "token_accuracy": 0.9, "exact_match": exact, "samples": 1000,
                          "elapsed_s": elapsed})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = {"run_dir": str(run_dir), "step": cfg.train.steps, "best_exact_match": exact,
               "wall_s": cfg.train.steps * 0.05, "exact_match": exact, "token_accuracy": 0.9,
               "loss": 0.01, "status": "finished", "steps": cfg.train.steps,
               "ended": "2026-12-07T21:04:43"}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if in_sweep:
        lo, hi = cfg.task.min_len, cfg.task.max_len
        report = {"exact_match": exact, "samples": 1000, "per_length": {
            str(n): {"count": 60, "exact_match": exact} for n in range(lo, hi + 1)}}
        (run_dir / f"eval-{lo}-{hi}.json").write_text(json.dumps(report))


def fake_runs(root: Path, n: int) -> None:
    """`n` runs under `root`: half in sweep folders of SWEEP_SIZE, half on their own."""
    for i in range(n):
        if i < n // 2:
            sweep = root / f"sweep-bench-{i // SWEEP_SIZE}"
            if not sweep.is_dir():
                sweep.mkdir(parents=True)
                (sweep / SWEEP_FILE).write_text(json.dumps({"grid": {}, "base": {}}))
            fake_run(sweep / f"run={i}", i, True)
        else:
            fake_run(root / f"run-{i}", i, False)


def timed(args: list[str]) -> tuple[float, float]:
    """Seconds a `minitfm ARGS` process takes, start to exit, and the CPU seconds it used (on
    a busy machine, nearer what it would take alone); it must succeed."""
    used, start = children_cpu(), time.perf_counter()
    done = subprocess.run([*python_module("minitfm"), *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"minitfm {' '.join(args)} failed: {done.stderr.strip()}")
    return seconds, children_cpu() - used


def children_cpu() -> float:
    """CPU seconds (user and system) of the processes this one has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="minitfm-runs-bench-") as folder:
        root = Path(folder) / "runs"
        fake_runs(root, n)
        print(f"{n} run folders under {root} (the default config's shape)")
        print(f"load average {' '.join(f'{n:.1f}' for n in os.getloadavg())} on "
              f"{os.cpu_count()} cores")
        for args in COMMANDS:
            times = [timed(["runs", str(root), *args, "--json"]) for _ in range(REPEATS)]
            wall, cpu = [t for t, _ in times], [c for _, c in times]
            print(f"minitfm runs DIR {' '.join(args)} --json: median {median(wall):.2f} s, "
                  f"slowest {max(wall):.2f} s, median CPU {median(cpu):.2f} s ({REPEATS} runs)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
