"""What a RUN argument means: a run directory, a checkpoint file, or, left out, the default run.

The default is the most recent run under ./runs with the checkpoint asked for, but not the run
of a learner's workbook or bug zoo (`model.code` a folder: its weights were trained by code
that may be half written, or planted with bugs), unless there is no other. Whenever RUN is left
out, a note names the run taken and its best exact match, so that a surprising answer is never
a mystery. No torch here (`plot` reads runs without it).
"""

from __future__ import annotations

from pathlib import Path

from minitfm.config import BUILT_IN_CODES
from minitfm.errors import CheckpointError, shown_path
from minitfm.run.rundir import CHECKPOINTS, find_run_dir, is_run_dir
from minitfm.run.summary import read_run_config, read_summary


def default_run(which: str = "best", log_dir: str | Path = "runs") -> tuple[Path, str]:
    """The run a RUN left out means, and the note that names it: the most recent run under
    `log_dir` that has `which`.pt (for "best": or last.pt), a learner's only if no other has."""
    root = Path(log_dir)
    names = ("best.pt", "last.pt") if which == "best" else (f"{which}.pt",)
    runs = [p.parent for p in root.glob("*/checkpoints") if p.is_dir()
            and any((p / name).is_file() for name in names)] if root.is_dir() else []
    if not runs:
        raise CheckpointError(f"no runs with a {' or '.join(names)} checkpoint under '{root}/': "
                              f"train one first (minitfm train) or give a run directory")
    runs.sort(key=lambda p: (p / "checkpoints").stat().st_mtime, reverse=True)
    own = [run for run in runs if not learners(run)]
    chosen = (own or runs)[0]
    if not own:
        which_one = "a workbook's or bug zoo's run, as there is no other"
    elif chosen != runs[0]:
        newer = runs.index(chosen)
        which_one = (f"the most recent run not trained by a workbook or bug zoo ({newer} newer "
                     f"{'is' if newer == 1 else 'are'}: give one as RUN to use it)")
    else:
        which_one = "the most recent run"
    return chosen, f"no RUN given: using {shown_path(chosen)} ({best_of(chosen)}), {which_one}"


def learners(run_dir: Path) -> bool:
    """Whether a run trained a learner's workbook or bug zoo (its config.yaml's model.code is a
    folder); a config that cannot be read counts as not."""
    try:
        config = read_run_config(run_dir) or {}
    except CheckpointError:
        return False
    code = (config.get("model") or {}).get("code", "fast")
    return isinstance(code, str) and code not in BUILT_IN_CODES


def best_of(run_dir: Path) -> str:
    """`best exact match 99.4%` from the run's summary.json (`no summary yet` without one)."""
    summary = read_summary(run_dir)
    if summary is None:
        return "no summary.json yet"
    best = summary.get("best_exact_match")
    return f"best exact match {best:.1%}" if isinstance(best, (int, float)) and best >= 0 \
        else "not evaluated yet"


def pick_checkpoint(run: str | Path | None, which: str = "best") -> tuple[Path, str | None]:
    """The checkpoint meant by a RUN argument (run directory, .pt file or None: `default_run`),
    and a note: the default run taken, and "best" falling back to last.pt because the run has
    not been evaluated yet."""
    if which not in CHECKPOINTS:
        raise CheckpointError(f"--checkpoint ({which!r}) must be one of {', '.join(CHECKPOINTS)}")
    path, default = default_run(which) if run is None else (Path(run), None)
    ckpt, note = checkpoint_of(path, which)
    return ckpt, "; ".join(filter(None, (default, note))) or None


def checkpoint_of(path: Path, which: str) -> tuple[Path, str | None]:
    """The checkpoint `which` of the run directory `path` (or `path`, a file), and a note when
    "best" falls back to last.pt."""
    if path.is_file():
        return path, None
    if not path.exists():
        raise CheckpointError(f"run '{path}' not found: give a run directory or a .pt file")
    if not path.is_dir():
        raise CheckpointError(f"'{path}' is not a file: give a run directory or a .pt file")
    ckpt, last = path / "checkpoints" / f"{which}.pt", path / "checkpoints" / "last.pt"
    if which == "best" and not ckpt.exists() and last.is_file():
        return last, f"run '{path}' has no best.pt yet (not evaluated so far): using last.pt"
    if ckpt.exists() and not ckpt.is_file():
        raise CheckpointError(f"'{ckpt}' is not a file")
    if not ckpt.is_file():
        other = [p.name for p in (path / "checkpoints").glob("*.pt")]
        hint = f" (it has {', '.join(sorted(other))})" if other else " (it has no checkpoints yet)"
        raise CheckpointError(f"run '{path}' has no {which} checkpoint{hint}")
    return ckpt, None


def resolve_checkpoint(run: str | Path | None, which: str = "best") -> Path:
    """The checkpoint file meant by a RUN argument (see `pick_checkpoint`), without the note."""
    return pick_checkpoint(run, which)[0]


def run_directory(run: str | Path | None, reads: str = "plot reads a run's metrics.jsonl",
                  notes: list[str] | None = None) -> Path:
    """The run directory a RUN argument means: the directory, the run of a checkpoint, or (None)
    `default_run`, its note added to `notes` (`reads` says, for a checkpoint outside any run,
    why one is needed). `pick_checkpoint` is its twin for the commands that read a checkpoint."""
    if run is None:
        path, note = default_run()
        if notes is not None:
            notes.append(note)
        return path
    path = Path(run)
    if not path.exists():
        raise CheckpointError(f"run '{path}' not found: give a run directory or a .pt file")
    if path.is_file():
        run_dir = find_run_dir(path)
        if run_dir is None:
            raise CheckpointError(f"checkpoint '{path}' is not inside a minitfm run "
                                  f"(<run>/checkpoints/): {reads}")
        return run_dir
    if not is_run_dir(path):
        raise CheckpointError(f"'{path}' is not a minitfm run directory (no config.yaml or "
                              f"metrics.jsonl written by minitfm)")
    return path
