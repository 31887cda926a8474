"""Atomic checkpoint saves and safe loads (the run directory they live in: see `rundir`).

Checkpoints hold only tensors, state dicts and plain containers, so they load with
`torch.load(weights_only=True)`: a file can never run code.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from minitfm.config import validate
from minitfm.errors import CheckpointError, ConfigError
from minitfm.run.files import write_atomic

FORMAT = "minitfm-checkpoint/1"
SAFE_MODULES = ("torch.", "collections.OrderedDict", "_codecs.encode")  # what torch.save writes
# What each use of a checkpoint reads: key -> (accepted types, their name in messages).
EVAL_KEYS = {"step": (int, "an integer"), "config": (dict, "a mapping"),
             "vocab": (list, "a list"), "model": (dict, "a mapping")}
RESUME_KEYS = {"optimizer": (dict, "a mapping"),
               "best_exact_match": ((int, float), "a number"), "rng": (dict, "a mapping")}
RNG_KEYS = {"torch": (torch.Tensor, "a tensor"), "data": (torch.Tensor, "a tensor"),
            "cuda": (list, "a list")}
MAX_VOCAB = 200_000  # tokens: synthetic tasks have at most 100,004, pairs 100,004 too
MAX_TOKEN_CHARS = 1_000  # the longest token string (a word, with task.tokenize space)


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` atomically (see `write_atomic`)."""
    buffer = io.BytesIO()  # serialised first: torch.save turns a full disk into a RuntimeError
    torch.save({"format": FORMAT, **state}, buffer)
    write_atomic(path, buffer.getbuffer())


def load_checkpoint(path: str | Path, resume: bool = False) -> dict[str, Any]:
    """Load a minitfm checkpoint on the CPU with `weights_only=True`, after checking that its
    archive is no bomb; the result has every key eval (or, with `resume`, training) needs."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' not found")
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' is not a file")
    check_archive(path)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))  # the pickle names a callable to run
        callable_ = found.group(1) if found else foreign_callable(path)
        if callable_:
            raise CheckpointError(f"checkpoint '{path}' was refused: it asks to run "
                                  f"{callable_}, which plain weights never do; only load "
                                  f"checkpoints you trust") from None
        raise CheckpointError(f"checkpoint '{path}' is corrupt, truncated or not a torch "
                              f"file; use the other checkpoint of the run or retrain") from None
    except Exception as err:  # noqa: BLE001 - junk bytes make the unpickler raise anything
        # (RuntimeError, EOFError, struct.error, IndexError, KeyError, TypeError...)
        first = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated ({first}); "
                              f"use the other checkpoint of the run or retrain") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a minitfm checkpoint (no '{FORMAT}' marker)")
    check_state(state, path, resume)
    return state


def check_archive(path: Path) -> None:
    """Refuse a zip whose entries torch would inflate: torch writes them stored, and a stored
    entry cannot be larger than the file (a zip bomb declares gigabytes in a few MB)."""
    if not zipfile.is_zipfile(path):
        return  # a legacy (pre-1.6) torch file: a plain pickle, no larger than the file
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint '{path}' is corrupt or truncated ({err}); "
                              f"use the other checkpoint of the run or retrain") from None
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"checkpoint '{path}' was refused: its entry "
                                  f"'{entry.filename}' is compressed, which torch never writes")
    declared, size = sum(entry.file_size for entry in entries), path.stat().st_size
    if declared > size:
        raise CheckpointError(f"checkpoint '{path}' was refused: its entries declare {declared} "
                              f"bytes but the file has {size}")


def foreign_callable(path: Path) -> str | None:
    """The first callable outside torch that the pickle in `path` names (read, never run)."""
    head = 2**24  # a callable comes early; bytes in memory keep genops from preallocating
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
                with archive.open(name) as f:
                    return first_foreign_global(f.read(head))
        with open(path, "rb") as f:
            return first_foreign_global(f.read(head))
    except (StopIteration, OSError, zipfile.BadZipFile):
        return None


def first_foreign_global(data: bytes) -> str | None:
    """Walk the pickle opcodes (nothing is executed) for GLOBAL and STACK_GLOBAL names;
    "code" when a STACK_GLOBAL's name cannot be told."""
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                name = str(arg).replace(" ", ".")
            elif op.name == "STACK_GLOBAL":
                name = ".".join(strings[-2:]) if len(strings) >= 2 else "code"
            else:
                if isinstance(arg, str):
                    strings.append(arg)
                continue
            if not name.startswith(SAFE_MODULES):
                return name
    except Exception:  # noqa: BLE001 - a damaged pickle: whatever genops raises
        return None
    return None


def check_state(state: dict[str, Any], path: Path, resume: bool = False) -> None:
    """Every key eval (and with `resume`, training) reads, of the right type; a valid config."""
    check_keys(state, EVAL_KEYS, path)
    if resume:
        check_keys(state, RESUME_KEYS, path)
        check_keys(state["rng"], RNG_KEYS, path, "rng.")
    vocab = state["vocab"]
    if len(vocab) > MAX_VOCAB or not all(
            isinstance(token, str) and len(token) <= MAX_TOKEN_CHARS for token in vocab):
        raise CheckpointError(f"checkpoint '{path}' does not fit this minitfm version "
                              f"('vocab' must be a list of strings: at most {MAX_VOCAB:,}, "
                              f"each of at most {MAX_TOKEN_CHARS:,} characters)")
    try:
        cfg = validate(state["config"])
    except ConfigError as err:
        raise CheckpointError(f"checkpoint '{path}' has an invalid config: {err}") from None
    from minitfm.tasks import TASKS

    problem = TASKS[cfg.task.name].saved_problem(state)  # pairs: its data, checked like the rest
    if problem:
        raise CheckpointError(f"checkpoint '{path}' does not fit this minitfm version "
                              f"({problem})")


def check_keys(state: dict[str, Any], keys: dict[str, tuple], path: Path, prefix: str = "") -> None:
    """Each of `keys` present in `state` with one of its types (a bool is no integer)."""
    for key, (types, what) in keys.items():
        if key not in state:
            raise CheckpointError(f"checkpoint '{path}' does not fit this minitfm version "
                                  f"(missing '{prefix}{key}')")
        value = state[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise CheckpointError(f"checkpoint '{path}' does not fit this minitfm version "
                                  f"('{prefix}{key}' must be {what}, got "
                                  f"{type(value).__name__})")


def checkpoint_mismatch(path: Path, err: Exception) -> CheckpointError:
    """A checkpoint whose tensors or keys this version cannot use: one line, naming the cause."""
    return CheckpointError(f"checkpoint '{path}' does not fit this minitfm version "
                           f"({type(err).__name__}: {str(err).splitlines()[0][:100]})")


def check_vocab(state: dict[str, Any], task, path: Path) -> None:
    """The checkpoint's vocabulary must be the one `task` has in this minitfm version."""
    if list(task.vocab.tokens) != list(state["vocab"]):
        raise CheckpointError(f"checkpoint '{path}' was made with another vocabulary "
                              f"than task {task.cfg.name!r} has in this minitfm version")


def optimizer_state(saved: dict[str, Any], optimizer) -> dict[str, Any]:
    """The optimizer state of a checkpoint as `book.optim.AdamW.load_state_dict` takes it.

    Checkpoints of minitfm 0.1 hold `torch.optim.AdamW`'s state instead: the weight matrices
    in group 0, the rest in group 1, numbered in that order; their moments go to the places
    of the same parameters in the flat vector.
    """
    if "state" not in saved:
        return saved
    params = optimizer.params
    order = [p for p in params if p.dim() >= 2] + [p for p in params if p.dim() < 2]
    moments = {name: torch.zeros_like(optimizer.flat) for name in ("exp_avg", "exp_avg_sq")}
    step = 0
    for index, p in enumerate(order):
        old = saved["state"].get(index)
        if old is None:  # no step taken yet
            continue
        start = optimizer.starts[p]
        for name, flat in moments.items():
            flat[start:start + p.numel()] = old[name].reshape(-1)
        step = int(old["step"])
    return {"step": step, **moments}
