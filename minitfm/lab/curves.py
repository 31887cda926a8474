"""A run's records, read with caps and checks: the curves of its `metrics.jsonl`, and the
evaluations a sweep saved beside it (`eval-A-B.json`).

What `minitfm plot` draws, `minitfm runs` lists, the sweep's table and results.png show and the
explorer's page embeds. A run can be damaged by a hand edit, a copy from elsewhere or a bug: a
line that holds no record minitfm writes is skipped (and counted, so the commands can say
which), a huge line costs no memory, and a torn last line, left by a killed run, is skipped
without a word; an evaluation that is not one minitfm writes counts as none. A file that cannot
be read (no permission, a link, a FIFO: see `run.rundir.open_run_file`) is said as such. No torch
here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minitfm.errors import CheckpointError
from minitfm.run.rundir import open_run_file, unreadable

MAX_LINE = 65_536  # characters of one metrics.jsonl line; a record is about 200
MAX_EVAL_BYTES = 1_000_000  # an eval-A-B.json: a few hundred bytes per length evaluated
NUMBERS = {"train": ("loss",), "eval": ("loss", "exact_match"),  # what plot and runs read
           "gauges": ("exact", "loss", "token_accuracy")}  # and the explorer (lab/watch/gauges)
FRACTIONS = {"eval": ("exact_match",), "gauges": ("exact", "token_accuracy")}  # within 0..1
LAST_STEP = 10**9  # train.steps' limit: no record minitfm writes has a later step
TAIL_BLOCK = 65_536  # bytes `last_record` reads at a time, from the end of metrics.jsonl
TAIL_LIMIT = 1_000_000  # and at most, however far back the record it looks for lies


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `metrics.jsonl` (none if it is missing); other lines are skipped."""
    return scan_metrics(run_dir)[0]


def scan_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of `metrics.jsonl` (none when there is no such file), and the numbers of
    the lines that hold none (a torn last line, left by a killed run, is skipped without a
    word). A file that cannot be read is a CheckpointError saying why."""
    records, bad = [], []
    path = run_dir / "metrics.jsonl"
    try:
        with open_run_file(path, "r", errors="replace") as f:
            for number, (line, whole) in enumerate(capped_lines(f), 1):
                record = parse_record(line)
                if record is not None:
                    records.append(record)
                elif whole:
                    bad.append(number)
    except FileNotFoundError:
        pass
    except OSError as err:
        shown = f"'{path}'"
        raise CheckpointError(unreadable(shown, err)) from None
    return records, bad


def last_record(run_dir: Path, split: str) -> dict[str, Any] | None:
    """The last record of `split` (train, eval, gauges) in `metrics.jsonl`, read from the end
    of the file a block at a time: a listing of hundreds of runs reads each one's tail, not its
    history. None when there is no such file, or no such record in its last TAIL_LIMIT bytes.
    Lines that hold no record are passed over (`scan_metrics` counts them), a torn last line
    too; a file that cannot be read is a CheckpointError saying why."""
    path = run_dir / "metrics.jsonl"
    try:
        with open_run_file(path, "rb") as f:
            end = position = f.seek(0, os.SEEK_END)
            rest = b""  # the start of a line whose beginning lies in the block before
            while position > 0 and end - position < TAIL_LIMIT:
                size = min(TAIL_BLOCK, position)
                position -= size
                f.seek(position)
                lines = (f.read(size) + rest).split(b"\n")
                rest = lines.pop(0) if position > 0 else b""
                for line in reversed(lines):
                    record = parse_record(line.decode("utf-8", errors="replace")) \
                        if len(line) <= MAX_LINE else None
                    if record is not None and record["split"] == split:
                        return record
                if len(rest) > MAX_LINE:  # a huge line costs no memory: what is kept of it
                    rest = b"x"  # ends no JSON object, so the line is skipped
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointError(unreadable(f"'{path}'", err)) from None
    return None


def capped_lines(f) -> Iterator[tuple[str, bool]]:
    """Each line of `f` cut to MAX_LINE characters (a huge line costs no memory), and whether
    it ended with a newline (the last line of a killed run may not)."""
    while line := f.readline(MAX_LINE):
        head = line
        while line and not line.endswith("\n"):  # the rest of a long line: skipped
            line = f.readline(MAX_LINE)
        yield head, line.endswith("\n")


def parse_record(line: str) -> dict[str, Any] | None:
    """A metrics line as minitfm writes it: an object with an integer `step` from 0 to
    LAST_STEP, a `split` (train, eval, gauges) and numbers where `plot` and `runs` read them,
    exact match and token accuracy within 0..1; else None."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than json can read
        return None
    if not isinstance(record, dict) or record.get("split") not in NUMBERS:
        return None
    split = record["split"]
    numbers = all(is_number(record.get(key)) for key in NUMBERS[split]) and \
        all(is_fraction(record[key]) for key in FRACTIONS.get(split, ()))
    elapsed = is_number(record.get("elapsed_s", 0.0))
    step = record.get("step")  # a 400-digit step is an int too: the maths cannot take it
    step = type(step) is int and 0 <= step <= LAST_STEP
    return record if numbers and elapsed and step else None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_eval(path: Path) -> dict[str, Any] | None:
    """An evaluation as `minitfm eval --json` writes it (None: no such file, or not one: it
    cannot be read, or it is no object with a finite `exact_match` in 0..1 and a `per_length`
    mapping of lengths to such numbers and a `count`)."""
    try:
        with open_run_file(path) as f:
            report = json.loads(f.read(MAX_EVAL_BYTES + 1))
    except (OSError, ValueError, RecursionError):  # not there, no file, not JSON, "[[[[..."
        return None
    if not isinstance(report, dict) or not is_fraction(report.get("exact_match")) or \
            not isinstance(report.get("per_length"), dict):
        return None
    for length, row in report["per_length"].items():
        if not (length.isascii() and length.isdigit() and isinstance(row, dict)
                and is_fraction(row.get("exact_match")) and type(row.get("count")) is int):
            return None
    return report


def is_fraction(value: Any) -> bool:
    """A number in 0..1 (no NaN, no bool)."""
    return is_number(value) and math.isfinite(value) and 0.0 <= value <= 1.0


def skipped(bad: list[int]) -> str:
    """`metrics.jsonl line 7 holds no record minitfm writes`, or `lines 7, 9, 12 hold`."""
    if len(bad) == 1:
        return f"metrics.jsonl line {bad[0]} holds no record minitfm writes"
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    return f"metrics.jsonl lines {shown} ({len(bad)}) hold no record minitfm writes"


def run_curves(run_dir: Path, notes: list[str] | None = None) -> dict[str, list[dict]]:
    """The run's train, eval and gauges records, one per step (a resumed run's later record
    wins); lines that hold no record are skipped, and said in `notes`."""
    records, bad = scan_metrics(run_dir)
    if not records and bad:
        raise CheckpointError(f"run '{run_dir}' has no metrics to plot: {skipped(bad)} (an "
                              f"object with step, split and loss per line)")
    if not records:
        raise CheckpointError(f"run '{run_dir}' has no metrics yet (metrics.jsonl is missing "
                              f"or empty): train it first")
    if bad and notes is not None:
        notes.append(f"run '{run_dir}': {skipped(bad)}: skipped")
    curves = {}
    for split in NUMBERS:
        by_step = {r["step"]: r for r in records if r["split"] == split}
        curves[split] = [by_step[step] for step in sorted(by_step)]
    return curves
