"""Run directories, atomic checkpoint saves and safe loads.

A run directory `runs/<name>-<YYYYmmdd-HHMMSS>/` holds `config.yaml` (resolved),
`metrics.jsonl`, `checkpoints/last.pt`, `checkpoints/best.pt` and TensorBoard event files.
Checkpoints hold only tensors, state dicts and plain containers, so they load with
`torch.load(weights_only=True)`: a file can never run code.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from minitfm.errors import CheckpointError

FORMAT = "minitfm-checkpoint/1"
CHECKPOINTS = ("best", "last")


def new_run_dir(log_dir: str | Path, name: str) -> Path:
    """A fresh `log_dir/<name>-<YYYYmmdd-HHMMSS>` (suffixed `-2`, `-3`... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(log_dir) / f"{name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def latest_run(log_dir: str | Path = "runs") -> Path:
    """The most recently modified run directory under `log_dir` that has checkpoints."""
    root = Path(log_dir)
    runs = [p for p in root.glob("*/checkpoints") if p.is_dir()] if root.is_dir() else []
    if not runs:
        raise CheckpointError(f"no runs with checkpoints under '{root}/': train one first "
                              f"(minitfm train) or give a run directory")
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def resolve_checkpoint(run: str | Path | None, which: str = "best") -> Path:
    """The checkpoint file meant by a RUN argument: a run directory, a .pt file, or None."""
    if which not in CHECKPOINTS:
        raise CheckpointError(f"--checkpoint ({which!r}) must be one of {', '.join(CHECKPOINTS)}")
    path = latest_run() if run is None else Path(run)
    if path.is_file():
        return path
    if not path.exists():
        raise CheckpointError(f"run '{path}' not found: give a run directory or a .pt file")
    ckpt = path / "checkpoints" / f"{which}.pt"
    if not ckpt.is_file():
        other = [p.name for p in (path / "checkpoints").glob("*.pt")]
        hint = f" (it has {', '.join(sorted(other))})" if other else " (it has no checkpoints yet)"
        raise CheckpointError(f"run '{path}' has no {which} checkpoint{hint}")
    return ckpt


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint file lives in (its parent's parent)."""
    return checkpoint.resolve().parent.parent


class RunLock:
    """An exclusive lock on a run directory while one process trains in it.

    `flock` is released by the kernel when the process dies, even by `kill -9`, so a stale
    lock can never block a later `--resume`.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.file = None

    def __enter__(self) -> RunLock:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CheckpointError(f"cannot create the run directory '{self.run_dir}' "
                                  f"({err.strerror}): check log.dir or --run-dir") from None
        self.file = open(self.run_dir / ".lock", "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            pid = self.file.read().strip() or "?"
            self.file.close()
            raise CheckpointError(f"run directory '{self.run_dir}' is in use by another "
                                  f"training process (pid {pid}): wait for it to finish or "
                                  f"use another --run-dir") from None
        self.file.truncate(0)
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` atomically: a temp file in the same folder, fsync, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a minitfm checkpoint on the CPU with `weights_only=True`; errors are clear."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))  # the pickle names a callable to run
        if found:
            raise CheckpointError(f"checkpoint '{path}' was refused: it asks to run "
                                  f"{found.group(1)}, which plain weights never do; only load "
                                  f"checkpoints you trust") from None
        raise CheckpointError(f"checkpoint '{path}' is corrupt, truncated or not a torch "
                              f"file; use the other checkpoint of the run or retrain") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        first = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated ({first}); "
                              f"use the other checkpoint of the run or retrain") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a minitfm checkpoint (no '{FORMAT}' marker)")
    return state


def append_metrics(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one JSON line to `metrics.jsonl`."""
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def load_model(path: Path, device: torch.device | str = "cpu"):
    """(config, task, model in eval mode, step) from a checkpoint file."""
    from minitfm.config import validate
    from minitfm.model import Seq2SeqTransformer
    from minitfm.tasks import make_task

    state = load_checkpoint(path)
    try:
        cfg = validate(state["config"])
        task = make_task(cfg.task)
        if list(task.vocab.tokens) != list(state["vocab"]):
            raise CheckpointError(f"checkpoint '{path}' was made with another vocabulary "
                                  f"than task {cfg.task.name!r} has in this minitfm version")
        model = Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id)
        model.load_state_dict(state["model"])
    except (KeyError, RuntimeError, TypeError) as err:
        raise CheckpointError(f"checkpoint '{path}' does not fit this minitfm version "
                              f"({type(err).__name__}: {str(err).splitlines()[0][:100]})") from None
    return cfg, task, model.to(device).eval(), state["step"]
