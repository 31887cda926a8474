"""Run directories through Ray's object store, for workers that do not see the sweep folder
(`ray_launcher.py`): packed whole on the worker (`pack`), then checked and put in place on the
driver (`receive`).

What comes back is checked before anything is replaced, whoever sent it (a node with another
minitfm, a broken disk): the archive is unpacked beside the sweep's runs with tarfile's `data`
filter (no path outside that folder, no link out of it), and must hold a real folder for the run
with nothing in it but folders and regular files (a run directory minitfm writes holds no
links), its evaluations those `minitfm eval --json` writes (`curves.read_eval`). Only then is
the old run folder swapped for it; on any problem the old one stays and the run fails, in one
line. No torch here, and no Ray: bytes in, bytes out.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

from minitfm.errors import MinitfmError, quote
from minitfm.lab.curves import read_eval
from minitfm.lab.many.grid import RunSpec
from minitfm.run.files import to_json, write_atomic
from minitfm.run.rundir import kind, lstat_mode, open_run_file

MAX_RETURN = 1_000_000_000  # bytes of a run directory sent back through the object store


def pack(run_dir: Path) -> bytes:
    """A run directory as a tar archive, refused past MAX_RETURN bytes."""
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    if size > MAX_RETURN:
        raise MinitfmError(f"the run directory {run_dir.name} holds {size:,} bytes, more than "
                           f"the {MAX_RETURN:,} a task sends back through Ray's object store: "
                           f"give the workers a shared folder for the sweep")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        archive.add(run_dir, arcname=run_dir.name)
    return data.getvalue()


class NotARunFolder(MinitfmError):
    """What a task sent back for a run is not a run folder: the run fails, the old one stays."""

    def __init__(self, spec: RunSpec, why: str):
        super().__init__(f"the run {spec.id} sent back by Ray is not a run folder: {why}")


def receive(spec: RunSpec, data: bytes, log: bytes) -> None:
    """A run directory sent back (a tar archive, `data`), checked, then put in place of the old
    one, its evaluations naming its checkpoint here; the task's log appended to the run's.
    Raises MinitfmError (NotARunFolder for what came back) and leaves the old folder as it
    was."""
    folder = spec.run_dir.parent
    try:
        with open_run_file(folder / f"{spec.id}.log", "ab") as f:
            f.write(log)  # what the task printed, whatever came back
        incoming = Path(tempfile.mkdtemp(prefix=f".{spec.id}.incoming-", dir=folder))
        try:
            arrived = unpack(spec, data, incoming)
            point_evaluations_here(spec, arrived)
            swap(arrived, spec.run_dir)
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
    except OSError as err:
        raise MinitfmError(f"the run {spec.id} sent back by Ray cannot be written into "
                           f"{quote(str(folder))} ({err.strerror or err})") from None


def unpack(spec: RunSpec, data: bytes, incoming: Path) -> Path:
    """The archive unpacked into `incoming` (nothing outside it), and the run's folder in it,
    checked to hold only folders and regular files."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:  # as `pack` makes
            stray = next((m.name for m in archive.getmembers()
                          if m.name != spec.id and not m.name.startswith(f"{spec.id}/")), None)
            if stray is not None:
                raise NotARunFolder(spec, f"its archive holds {quote(stray)}, outside the "
                                          f"folder {quote(spec.id)}")
            archive.extractall(incoming, filter="data")  # no path outside, no links out
    except (tarfile.TarError, EOFError, ValueError) as err:  # FilterError is a TarError
        why = " ".join(str(err).split())  # one line
        raise NotARunFolder(spec, f"its archive cannot be unpacked ({why})") from None
    arrived = incoming / spec.id
    found = lstat_mode(arrived)
    if found is None:
        raise NotARunFolder(spec, f"its archive holds no folder {quote(spec.id)}")
    if not stat.S_ISDIR(found):
        raise NotARunFolder(spec, f"{quote(spec.id)} in its archive is {kind(found)}")
    for parent, names, files in os.walk(arrived):
        for name in [*names, *files]:
            path = Path(parent) / name
            mode = os.lstat(path).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                shown = quote(str(path.relative_to(incoming)))
                raise NotARunFolder(spec, f"{shown} is {kind(mode)}, which no run directory "
                                          f"holds")
    return arrived


def point_evaluations_here(spec: RunSpec, arrived: Path) -> None:
    """Each evaluation, read with the checked reader, rewritten whole (never through a link)
    to name the run's checkpoint in the sweep folder, not the worker's."""
    for report_path in sorted(arrived.glob("eval-*.json")):
        report = read_eval(report_path)
        if report is None:
            shown = quote(f"{spec.id}/{report_path.name}")
            raise NotARunFolder(spec, f"{shown} is no evaluation minitfm eval --json writes")
        report["checkpoint"] = str(spec.run_dir / "checkpoints" / "last.pt")
        write_atomic(report_path, (to_json(report) + "\n").encode("utf-8"))


def swap(arrived: Path, run_dir: Path) -> None:
    """`arrived` renamed into place of `run_dir` (the old one renamed aside first, then removed;
    put back if the new one cannot take its place)."""
    old = run_dir.parent / f".{run_dir.name}.old-{secrets.token_hex(4)}"
    had = lstat_mode(run_dir) is not None
    if had:
        run_dir.rename(old)
    try:
        arrived.rename(run_dir)
    except OSError:
        if had:
            old.rename(run_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)
