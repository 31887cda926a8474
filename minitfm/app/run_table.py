"""The Python API's table of runs: `load_runs`, every run under a folder as a row, to filter,
group and plot with pandas.

    >>> from minitfm import load_runs
    >>> runs = load_runs("runs", where={"train.lr": 0.005})  # a pandas DataFrame
    >>> runs.groupby("model.positional")["exact_match"].mean()

A row is `minitfm runs`' record of a run (`lab/many/query.py`): its name, sweep and status,
every config key flattened (`train.lr`), its summary (`summary.step`), held-out exact match
(`exact_match`) and per input length (`per_length.17`), its last gauge readings
(`gauges.align`). pandas is an optional extra (`pip install 'minitfm[frame]'`); without it the
rows are plain dicts. No torch here: `minitfm.load_runs` is as quick as `minitfm runs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from minitfm.errors import MinitfmError
from minitfm.lab.many.query import load_records, select

FRAME_EXTRA = "pip install 'minitfm[frame]' (or pip install pandas)"


def load_runs(folder: str | Path = "runs", where: Mapping[str, Any] | None = None,
              as_frame: bool | None = None):
    """Every run under `folder` (its sweep folders' runs too, in `minitfm runs`' order) whose
    keys have the values of `where` (`{"train.lr": 0.005}`: compared as `--where` does, 5e-3
    is 0.005), a row each: a pandas DataFrame (`as_frame` None: where pandas is installed), or
    a list of dicts (`as_frame=False`, or None without pandas). A key of `where` that no run
    has is a MinitfmError naming the keys close to it."""
    if not isinstance(folder, (str, Path)):
        raise MinitfmError(f"folder must be a path (str or Path), not a "
                           f"{type(folder).__name__}")
    if where is not None and not (isinstance(where, Mapping)
                                  and all(isinstance(key, str) for key in where)):
        raise MinitfmError(f"where must map keys to values, e.g. {{'train.lr': 0.005}}, not "
                           f"{type(where).__name__} {where!r:.60}")
    if as_frame not in (None, True, False):
        raise MinitfmError(f"as_frame must be True, False or None, not {as_frame!r:.60}")
    root = Path(folder)
    records = select(load_records(root), list((where or {}).items()), root)
    pandas = frame_library(required=as_frame is True)
    if pandas is None or as_frame is False:
        return records
    return pandas.DataFrame.from_records(records)


def frame_library(required: bool):
    """pandas, or None where it is not installed; `required`, a MinitfmError saying how to
    install it."""
    try:
        import pandas
    except ImportError:
        if required:
            raise MinitfmError(f"as_frame=True needs pandas, which is not installed: "
                               f"{FRAME_EXTRA}; as_frame=False gives the rows as dicts") from None
        return None
    return pandas
