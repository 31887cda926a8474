"""Every run under a folder, found by its settings: `minitfm runs --where/--group-by` and
`minitfm.load_runs`.

A run's record is one flat row (`run_record`): `run` (its name under the folder), `sweep` (the
sweep folder holding it, if any), `run_dir`, `status` and `updated` as `minitfm runs` says
them; every key of its config.yaml, flattened (`seed`, `train.lr`; None where it says null);
its summary.json (`summary.step`, `summary.wall_s`, ...); held-out exact match as `minitfm
compare` reads it (`exact_match`: the sweep's evaluation of the trained lengths, else the run's
last evaluation) and whether it reached its target (`reached`), both from `seeds.run_outcome`;
exact match per input length of the evaluations beside it (`per_length.17`, from
eval-A-B.json); and the last gauge readings (`gauges.align`, ...: metrics.jsonl's last gauges
record, read from the end of the file). Only those files are read: hundreds of runs answer in
a moment. A run that cannot be read has its name, status and a `note` saying why.

`--where KEY=VALUE` keeps the runs whose KEY has that value, compared as typed values (`same`);
`--group-by KEY` gathers them by their values of the keys, each group with the figures a sweep
gives a configuration (`seeds.summarise`: n, held-out exact match, runs at target and steps,
with 95% intervals). A key that no run has is refused, naming the keys close to it. No torch.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from minitfm.config import flatten
from minitfm.errors import ConfigError, MinitfmError, quote, shown_path
from minitfm.lab.curves import is_number, last_record, read_eval
from minitfm.lab.many.results import range_of
from minitfm.lab.many.runs import list_runs, short_label, sweep_of, updated
from minitfm.lab.many.seeds import run_outcome, summarise
from minitfm.overrides import parse_override, split_key_value
from minitfm.run.summary import read_summary

HELD_OUT = "held-out"  # the group figures' name for `exact_match`: `exact_match held-out mean`


def load_records(root: Path) -> list[dict[str, Any]]:
    """The record of every run under `root` (its sweeps' runs too), in `minitfm runs`' order."""
    return list_runs(root, run_record)


def run_record(run_dir: Path, root: Path) -> dict[str, Any]:
    """A run as one flat record (see the module's docstring); `root` names it."""
    sweep, outcome = sweep_of(run_dir), run_outcome(run_dir)
    latest = run_dir / "metrics.jsonl"
    identity = {"run": str(run_dir.relative_to(root)) if run_dir != root else run_dir.name,
                "sweep": sweep.name if sweep else None, "run_dir": str(run_dir),
                "status": outcome["status"],
                "updated": updated(latest if latest.is_file() else run_dir / "config.yaml")}
    if "config" not in outcome:  # unreadable: `note` says why
        return {**identity, **({"note": outcome["note"]} if "note" in outcome else {})}
    record = {**identity, **plain(outcome["config"])}
    record.update(plain(flatten(read_summary(run_dir) or {}, "summary.")))
    record.update(exact_match=outcome["exact_match"], reached=outcome["reached"])
    record.update(lengths(run_dir))
    record.update(plain(flatten(gauges(run_dir), "gauges.")))
    record.update(identity)  # over a hand-edited config's own `status` or `run`
    return record


def plain(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened mapping's single values (numbers, text, booleans; no lists), None where
    `flatten` wrote "null"."""
    return {key: None if value == "null" else value for key, value in flat.items()
            if value is None or isinstance(value, (str, int, float, bool))}


def lengths(run_dir: Path) -> dict[str, float]:
    """`per_length.N`: held-out exact match at input length N, from every evaluation saved in
    the run (`eval-A-B.json`, as `minitfm sweep` writes them)."""
    found = {}
    for path in sorted(run_dir.glob("eval-*-*.json"), key=lambda p: range_of(p) or (0, 0)):
        report = read_eval(path) if range_of(path) else None
        for length, row in (report or {"per_length": {}})["per_length"].items():
            found[int(length)] = row["exact_match"]
    return {f"per_length.{n}": found[n] for n in sorted(found)}


def gauges(run_dir: Path) -> dict[str, Any]:
    """The last gauges record of metrics.jsonl (none: {}), without its `split`."""
    try:
        record = last_record(run_dir, "gauges") or {}
    except MinitfmError:  # a metrics.jsonl that cannot be read: `minitfm runs` says why
        record = {}
    return {key: value for key, value in record.items() if key != "split"}


# --- --where and --group-by ---

def parse_where(items: list[str]) -> list[tuple[str, Any]]:
    """`--where KEY=VALUE` items as (key, typed value), each value read as an override's is:
    `train.lr=5e-3` is 0.005, `null` None, `name=2024` the text."""
    conditions = []
    for item in items:
        split = split_key_value(item)
        if split is None:
            raise MinitfmError(f"--where {quote(item)} must look like KEY=VALUE, e.g. "
                               f"train.lr=0.005")
        try:
            conditions.append(parse_override(item))
        except ConfigError:
            raise MinitfmError(f"--where {quote(item)} must give one value, e.g. "
                               f"{split[0]}=0.005") from None
    return conditions


def same(have: Any, want: Any) -> bool:
    """Whether a run's value is the value asked for: numbers by value (0.005 and 5e-3, 2 and
    2.0), never a bool for a number; anything else of the same type and equal."""
    if is_number(have) and is_number(want):
        return have == want
    return type(have) is type(want) and have == want


def select(records: list[dict[str, Any]], conditions: list[tuple[str, Any]],
           root: Path) -> list[dict[str, Any]]:
    """The records that have every (key, value) of `conditions`."""
    check_keys(records, [key for key, _ in conditions], root, "--where")
    return [record for record in records
            if all(key in record and same(record[key], want) for key, want in conditions)]


def check_keys(records: list[dict[str, Any]], keys: list[str], root: Path,
               option: str) -> None:
    """A MinitfmError for the first of `keys` that no record has, naming the keys close to it
    (`lr`: train.lr)."""
    known = list(dict.fromkeys(key for record in records for key in record))
    for key in keys:
        if key not in known:
            close = close_keys(key, known)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else \
                " (a key of the config such as train.lr, summary.KEY, gauges.KEY, status, " \
                "exact_match or per_length.N)"
            where = f"no run under {shown_path(root)}" if records else \
                f"there are no runs under {shown_path(root)}, so none"
            raise MinitfmError(f"{option} {quote(key)}: {where} has this key{hint}")


def unmatched(records: list[dict[str, Any]], conditions: list[tuple[str, Any]],
              limit: int = 6) -> str:
    """Why no record matches: ` (train.lr is 0.001, 0.003 or 0.01 here)`, the values of the
    first condition's key when no record meets it on its own (` (seed is one of 10 values
    here: 0, 1, 2, 3, 4, 5, ...)`); nothing when each alone is met."""
    for key, want in conditions:
        if any(key in record and same(record[key], want) for record in records):
            continue
        values = sorted({shown(record[key]): record[key] for record in records
                         if key in record}.values(), key=in_order)
        said = [shown(value) for value in values]
        if len(said) > limit:
            return f" ({key} is one of {len(said)} values here: {', '.join(said[:limit])}, ...)"
        listed = said[0] if len(said) == 1 else f"{', '.join(said[:-1])} or {said[-1]}"
        return f" ({key} is {listed} here)"
    return ""


def close_keys(key: str, known: list[str]) -> list[str]:
    """The known keys named like `key` in any section (`lr`: train.lr), else up to three that
    are spelled like it."""
    named = [name for name in known if name.rpartition(".")[2] == key.rpartition(".")[2]]
    return named[:3] or difflib.get_close_matches(key, known, n=3, cutoff=0.6)


def group_rows(records: list[dict[str, Any]], keys: list[str]) -> list[dict[str, Any]]:
    """A row per value of `keys` among the records (values in order, a run without the key
    under None): the values, then the figures `minitfm sweep` gives a configuration
    (`seeds.summarise`), held-out exact match as `exact_match held-out ...`."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(tuple(record.get(key) for key in keys), []).append(record)
    rows = []
    for values in sorted(groups, key=lambda values: [in_order(value) for value in values]):
        label = short_label(", ".join(f"{key}={shown(value)}" for key, value in
                                      zip(keys, values, strict=True)))
        outcomes = [outcome(record, label) for record in groups[values]]
        rows.append({**dict(zip(keys, values, strict=True)), **summarise(outcomes, [HELD_OUT])})
    return rows


def outcome(record: dict[str, Any], label: str) -> dict[str, Any]:
    """A record as a row of a sweep's results.jsonl, which `seeds.summarise` takes."""
    return {"configuration": label, "status": record["status"],
            "exact_match": {HELD_OUT: record.get("exact_match")},
            "target": record.get("train.target_exact_match"), "reached": record.get("reached"),
            "steps": record.get("summary.step"), "wall_s": record.get("summary.wall_s")}


def in_order(value: Any) -> tuple:
    """A value's place among a key's values: numbers by value, then text, then None."""
    if is_number(value) or isinstance(value, bool):
        return (0, value, "")
    return (2, 0, "") if value is None else (1, 0, str(value))


def shown(value: Any) -> str:
    """A value as an override writes it: `null` for None."""
    return "null" if value is None else str(value)
