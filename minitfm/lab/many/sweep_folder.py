"""The sweep folder: its name (`sweep-<name>-<changes>-<stamp>`), the folder of the same grid
and base config found again to resume, and `--out` checked before anything is written into it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from minitfm.config import flatten, load_config
from minitfm.errors import MinitfmError, quote
from minitfm.lab.many.grid import (
    NAME_MAX,
    Grid,
    RunSpec,
    grid_text,
)
from minitfm.lab.many.runs import SWEEP_FILE, read_record
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.rundir import (
    is_run_dir,
    new_run_dir,
)

STAMP = "-YYYYmmdd-HHMMSS"  # the end of a default sweep folder's name


def sweep_folder(grid: Grid, name: str, out: Path | None, base: dict[str, Any],
                 runs: list[RunSpec]) -> tuple[Path, str | None]:
    """`out` (checked), else the newest `<log.dir>/sweep-<name>-<changes>-<stamp>` (see
    `folder_prefix`; or `sweep-<name>-<stamp>`, as an older minitfm named every sweep) holding
    this grid from this base config, else a new one; with a note when only the base config
    differs from an old one."""
    if out is not None:
        check_folder(out, grid, base, runs)
        return out, None
    cfg = load_config(grid.config, grid.fixed)
    check_fits(training_parts(cfg), "training")  # the grid's fixed part alone must fit
    root = Path(cfg.log.dir)
    prefix = folder_prefix(name, grid, runs[0].fixed)
    named = sorted((stamped(p)[1:], p) for p in root.glob(f"sweep-{name}-*")
                   if stamped(p)[0] in (prefix, f"sweep-{name}"))  # not `--name <name>-x`'s
    same = [p for _, p in named if (read_record(p) or {}).get("grid") == grid.spec()]
    resumable = [p for p in same if base_change(read_record(p), base) is None]
    if resumable:
        return resumable[-1], None
    folder = new_run_dir(root, prefix)
    if not same:
        return folder, None
    # An edited config is another experiment: its runs go beside the old ones, never among them.
    return folder, (f"the base config changed since {same[-1]} "
                    f"({base_change(read_record(same[-1]), base)}): a new sweep folder")


def folder_prefix(name: str, grid: Grid, fixed: dict[str, str]) -> str:
    """`sweep-<name>-<changes>`, `<changes>` what the grid changes in the config file
    (`grid.grid_text`: its swept keys with their values, its fixed overrides that change the
    file's values, never the seed) cut to the room the stamp leaves in a file name;
    `sweep-<name>` when it changes nothing."""
    room = NAME_MAX - len(f"sweep-{name}-{STAMP}-99")  # the `-` before the changes, the stamp
    changes = grid_text(grid, fixed, room)
    return f"sweep-{name}-{changes}" if changes else f"sweep-{name}"


def stamped(folder: Path) -> tuple[str, str, int]:
    """A folder's name as `new_run_dir` writes it: (the name before the stamp, the stamp
    `YYYYmmdd-HHMMSS`, its `-N` where the name was taken, else 1); ("", "", 0) without one."""
    found = re.fullmatch(r"(.*)-(\d{8}-\d{6})(?:-(\d+))?", folder.name)
    return (found[1], found[2], int(found[3] or 1)) if found else ("", "", 0)


def sweep_name(name: str | None, config: str | None) -> str:
    """`--name` as given (checked), else the config's file name with other characters as `_`:
    the folder's name begins `sweep-<name>-` (`folder_prefix`)."""
    limit = NAME_MAX - len(f"sweep-{STAMP}-99")  # the folder's name must fit a file name
    if name is None:
        derived = Path(config).stem if config else "default"
        return re.sub(r"[^A-Za-z0-9_.-]", "_", derived)[:limit]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise MinitfmError(f"--name ({quote(name)}) may hold only letters, digits, '_', '-', '.'")
    if len(name) > limit:
        raise MinitfmError(f"--name has {len(name)} characters, at most {limit}: the folder "
                           f"sweep-<name>{STAMP} must fit a file name")
    return name


def check_out(out: Path) -> None:
    """`--out` is a folder (or none yet) with a file name that fits, never in a run."""
    shown = quote(str(out))
    existing = next(p for p in [out, *out.parents] if p.exists() or p.is_symlink())
    if not existing.is_dir():
        raise MinitfmError(f"--out {shown}: {quote(str(existing))} is not a folder: give a "
                           f"new or empty folder")
    if any(len(part.encode()) > NAME_MAX for part in out.parts):
        raise MinitfmError(f"--out {shown} has a name longer than {NAME_MAX} bytes: give a "
                           f"shorter one")
    inside = next((p for p in [out.resolve(), *out.resolve().parents] if is_run_dir(p)), None)
    if inside is not None:
        raise MinitfmError(f"--out {shown} is a run directory or inside one "
                           f"({quote(str(inside))}): a sweep folder holds runs; give a folder "
                           f"outside any run")


def check_folder(folder: Path, grid: Grid, base: dict[str, Any], runs: list[RunSpec]) -> None:
    """What a sweep folder may hold: its sweep.json with this grid and base config, else
    nothing but this sweep's runs (as the commands of its `--dry-run` make them)."""
    record = read_record(folder)
    if record is None:
        ours = {".lock", *(spec.id for spec in runs), *(f"{spec.id}.log" for spec in runs)}
        stray = next((p.name for p in folder.iterdir() if p.name not in ours), None) \
            if folder.is_dir() else None
        if stray is not None:
            raise MinitfmError(f"--out {quote(str(folder))} holds {quote(stray)}, which is no "
                               f"part of this sweep (and no {SWEEP_FILE} written by minitfm): "
                               f"give a new or empty folder, or this sweep's own")
        return
    if record["grid"] != grid.spec():
        raise MinitfmError(f"--out {quote(str(folder))} holds another sweep (its grid is in "
                           f"{folder / SWEEP_FILE}): pick another folder")
    change = base_change(record, base)
    if change is not None:
        raise MinitfmError(f"--out {quote(str(folder))} holds this grid trained from another "
                           f"base config ({change}): give a new --out to train it anew, or "
                           f"restore the config to resume")


def base_config(runs: list[RunSpec], grid: Grid) -> dict[str, Any]:
    """What the runs share: the first run's resolved config without its swept keys (and
    threads, which the sweep sets per job, and log.mlflow, which says where it is watched, not
    what it trains), flat, as stored in `sweep.json`."""
    flat = flatten(runs[0].cfg.model_dump(mode="json"))
    for key in ["threads", "log.mlflow", *(key for key, _ in grid.swept), *grid.searched]:
        flat.pop(key, None)
    return json.loads(json.dumps(flat))  # as read back from the file (lists, not tuples)


def base_change(record: dict[str, Any] | None, base: dict[str, Any]) -> str | None:
    """None when `record` was made from `base`, else the first key that differs, both values."""
    stored = (record or {}).get("base")
    if stored is None:  # a folder from before sweep.json held it: nothing to compare
        return None
    if not isinstance(stored, dict):
        return f"{SWEEP_FILE} holds no readable base config"
    for key in [*base, *(key for key in stored if key not in base)]:
        if stored.get(key) != base.get(key):
            return f"{key} was {quote(stored.get(key))}, now {quote(base.get(key))}"
    return None
