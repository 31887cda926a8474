"""`minitfm compare`: two configurations, each a set of runs, told apart only as far as the
data allows.

A side is a configuration of a sweep (`SWEEP A B`: its `#` in the sweep's table or its label;
`SWEEP_A A SWEEP_B B`: one of each of two sweeps), or a set of run directories (`--a DIR
--b DIR`, each DIR a run or a folder of runs). Each run's figures are `seeds.run_outcome`'s;
only the runs that ended count (the others are named). For each figure (held-out exact
match, steps and seconds to the target, success rate): each side's mean and 95% interval,
the difference A - B with its 95% interval, a permutation test and its p-value, paired by seed
when both sides hold the same seeds, and, when the test finds nothing, the smallest
difference these n could have found; then how many seeds a difference needs (the observed
one, or `--effect`). The settings in which the two sides differ are read from their runs'
resolved configs (`differences`), whatever the form of the sides. The maths is `stats.py`'s,
the sentences `verdicts.py`'s, the notes on what else may move the figures (settings, how and
when the seconds were measured) `conditions.py`'s. No torch here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from minitfm.errors import MinitfmError, quote, shown_path
from minitfm.lab.many.conditions import ran_first, settings_note, timing_note
from minitfm.lab.many.results import by_configuration
from minitfm.lab.many.runs import HIDDEN_KEYS, SWEEP_FILE, find_runs, short_label
from minitfm.lab.many.seeds import ended, named, run_outcome
from minitfm.lab.many.stats import (
    ALPHA,
    POWER,
    Interval,
    detectable,
    detectable_rate,
    mean_interval,
    newcombe,
    paired_test,
    pooled_sd,
    rate_interval,
    seeds_for_any_test,
    seeds_needed,
    seeds_needed_rate,
    smallest_p,
    unpaired_test,
    welch_interval,
)
from minitfm.lab.many.verdicts import resolution, seeds_line, verdict
from minitfm.run.rundir import open_run_file, unreadable
from minitfm.run.summary import DONE

FIGURES = {"exact_match": "held-out exact match", "steps": "steps to target",
           "seconds": "seconds to target", "success": "success rate"}
MAX_RESULTS_BYTES = 200_000_000  # results.jsonl of the largest grid, per-length figures and all


@dataclass
class Side:
    """One side of a comparison: what it is, its runs that ended, and those left out."""

    name: str  # A or B
    label: str
    runs: list[dict[str, Any]]
    left_out: list[str] = field(default_factory=list)
    mixed: list[str] = field(default_factory=list)  # config keys in which its runs differ
    swept: tuple[str, ...] = ()  # the keys its configuration of a sweep is named by
    sweep: Any = None  # that sweep folder (`identity`)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "n": len(self.runs), "runs": [r["run"] for r in self.runs],
                "left_out": self.left_out, "differ_in": self.mixed,
                "label_keys": [key for key in self.swept if key != "seed"]}


def make_side(name: str, label: str, run_dirs: list[Path], swept: tuple[str, ...] = (),
              sweep: Any = None) -> Side:
    """The side's runs read (`seeds.run_outcome`), each once however its path is spelled;
    those that did not end are left out, named."""
    once: dict[Any, Path] = {}
    for run_dir in run_dirs:
        once.setdefault(identity(run_dir), run_dir)
    outcomes = [run_outcome(run_dir) for run_dir in once.values()]
    done = ended(outcomes)
    left = [f"{r['run']} ({r['status']}{': ' + r['note'] if 'note' in r else ''})"
            for r in outcomes if r["status"] not in DONE]
    if not done:
        raise MinitfmError(f"{name} ({label}) has no run that ended (finished or stopped at "
                           f"target): {', '.join(left) or 'no run'}; finish or resume its runs")
    configs = [r["config"] for r in done]
    mixed = [key for key in dict.fromkeys(k for config in configs for k in config)
             if key not in (*HIDDEN_KEYS, "seed")
             and len({repr(config.get(key)) for config in configs}) > 1]
    return Side(name, label, done, left, mixed, swept, sweep)


def identity(run_dir: Path | str) -> Any:
    """A run as itself, however its path is spelled (absolute, through a link, with `..`): its
    device and inode, else (no such folder) its resolved path."""
    try:
        found = os.stat(run_dir)
    except OSError:
        return str(Path(run_dir).resolve())
    return found.st_dev, found.st_ino


def sweep_rows(folder: Path) -> list[dict[str, Any]]:
    """A sweep folder's results.jsonl: each row's run (a folder in it) and configuration."""
    shown = quote(shown_path(folder))
    if not (folder / SWEEP_FILE).is_file():
        raise MinitfmError(f"{shown} is no sweep folder (no {SWEEP_FILE}): give a sweep folder "
                           f"and two of its configurations, or runs with --a DIR --b DIR")
    try:
        with open_run_file(folder / "results.jsonl", "r", errors="replace") as f:
            lines = f.read(MAX_RESULTS_BYTES).splitlines()
    except FileNotFoundError:
        raise MinitfmError(f"{shown} has no results.jsonl yet: run the sweep to its end (the "
                           f"same command resumes it)") from None
    except OSError as err:
        raise MinitfmError(f"{shown}: {unreadable('results.jsonl', err)}") from None
    rows, seen = [], {}
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if not (isinstance(row, dict) and isinstance(row.get("configuration"), str)
                and isinstance(row.get("run"), str)
                and re.fullmatch(r"[^/\0]+", row["run"]) and row["run"] not in (".", "..")):
            raise MinitfmError(f"{shown}: line {number} of results.jsonl is no row minitfm "
                               f"writes; run the sweep command again to write it anew")
        if row["run"] in seen:  # counted twice, it would weigh double
            raise MinitfmError(f"{shown}: line {number} of results.jsonl repeats the run "
                               f"{quote(row['run'])} (line {seen[row['run']]}); run the sweep "
                               f"command again to write it anew")
        seen[row["run"]] = number
        rows.append(row)
    if not rows:
        raise MinitfmError(f"{shown}: results.jsonl holds no run; run the sweep command again "
                           f"to write it anew")
    return rows


def sweep_side(name: str, folder: Path, which: str) -> Side:
    """The configuration `which` of a sweep: its `#` in the sweep's table, or its label (as
    the table or results.jsonl write it, `positional=rope` or `model.positional=rope`, or its
    values alone, `rope`)."""
    groups = by_configuration(sweep_rows(folder))
    labels = list(groups)
    search = all(label.startswith("trial=") for label in labels)
    if search:  # by its trial's number
        trial = which.removeprefix("trial=")
        chosen = next((label for label in labels if label.split(", ")[0] == f"trial={trial}"),
                      None)
        number = "its trial's number in the search's table"
    else:
        chosen = labels[int(which) - 1] if which.isdigit() and 1 <= int(which) <= len(labels) \
            else next((label for label in labels if which in (label, short_label(label),
                                                               values_of(label))), None)
        number = f"its # in the sweep's table (1..{len(labels)})"
    if chosen is None:
        known = ", ".join(quote(named(label)) for label in labels[:6])
        raise MinitfmError(f"{name} ({quote(which)}) is no configuration of "
                           f"{quote(shown_path(folder))}: give {number} or its label: {known}")
    # a trial's label starts with its number (`trial=3, lr=...`); a grid's gets its `#`
    label = named(chosen) if search else f"#{labels.index(chosen) + 1} {named(chosen)}"
    swept = tuple(part.partition("=")[0] for part in chosen.split(", ") if "=" in part)
    return make_side(name, label, [folder / row["run"] for row in groups[chosen]], swept,
                     identity(folder))


def values_of(label: str) -> str:
    """`model.positional=rope, train.lr=0.01` -> `rope, 0.01`."""
    return ", ".join(part.partition("=")[2] for part in label.split(", "))


def runs_side(name: str, folders: list[Path]) -> Side:
    """Run directories given by `--a`/`--b`: each a run, or a folder of runs (a sweep folder:
    all of its runs)."""
    try:
        run_dirs = [run for folder in folders for run in find_runs(folder)]  # once: make_side
    except MinitfmError as err:
        raise MinitfmError(f"--{name.lower()}: {err}") from None
    if not run_dirs:
        raise MinitfmError(f"--{name.lower()} {quote(shown_path(folders[0]))} holds no run "
                           f"directory: give runs, or folders of runs")
    label = ", ".join(shown_path(folder) for folder in folders)
    return make_side(name, label, run_dirs)


def choose_sides(args: list[str], a: list[Path], b: list[Path]) -> tuple[Side, Side]:
    """`SWEEP A B`, `SWEEP_A A SWEEP_B B`, or `--a DIR... --b DIR...`, never a mix."""
    if args and (a or b):
        raise MinitfmError("give either SWEEP A B (configurations of sweeps) or --a DIR --b "
                           "DIR (sets of runs), not both")
    if a or b:
        if not (a and b):
            raise MinitfmError(f"--{'b' if a else 'a'} is missing: give both sides, --a DIR "
                               f"--b DIR (repeat each for more folders)")
        sides = runs_side("A", a), runs_side("B", b)
    elif len(args) == 3:
        sides = sweep_side("A", Path(args[0]), args[1]), sweep_side("B", Path(args[0]), args[2])
    elif len(args) == 4:
        sides = sweep_side("A", Path(args[0]), args[1]), sweep_side("B", Path(args[2]), args[3])
    else:
        raise MinitfmError(f"compare takes SWEEP A B, SWEEP_A A SWEEP_B B, or --a DIR --b DIR "
                           f"(got {len(args)} argument{'s' if len(args) != 1 else ''})")
    on_b = {identity(r["run_dir"]) for r in sides[1].runs}
    both = [r["run_dir"] for r in sides[0].runs if identity(r["run_dir"]) in on_b]
    if both:
        raise MinitfmError(f"the run {quote(shown_path(both[0]))} is on both sides: give two "
                           f"different sets of runs")
    return sides


def parse_effects(texts: list[str]) -> dict[str, float]:
    """`--effect steps=50` (repeatable): the difference to size, per figure."""
    effects = {}
    for text in texts:
        name, _, size = text.partition("=")
        try:
            value = float(size)
        except ValueError:
            value = -1.0
        if name.strip() not in FIGURES or not 0 < value < float("inf"):
            raise MinitfmError(f"--effect ({quote(text)}) must look like FIGURE=SIZE, FIGURE one "
                               f"of {', '.join(FIGURES)} and SIZE a positive number (rates as "
                               f"fractions), e.g. steps=50 or exact_match=0.02")
        effects[name.strip()] = value
    return effects


def paired_seeds(a: Side, b: Side) -> list[int] | None:
    """The seeds both sides hold, each once on each side, when those are all their runs
    (then the runs are paired by seed); else None."""
    seeds_a, seeds_b = [r["seed"] for r in a.runs], [r["seed"] for r in b.runs]
    if None in seeds_a or None in seeds_b or len(set(seeds_a)) < len(seeds_a) \
            or len(set(seeds_b)) < len(seeds_b) or set(seeds_a) != set(seeds_b):
        return None
    return sorted(seeds_a) if len(seeds_a) >= 2 else None


def unpaired_why(a: Side, b: Side) -> str | None:
    """Why the runs are not paired by seed, in words; None when they are."""
    seeds_a, seeds_b = [r["seed"] for r in a.runs], [r["seed"] for r in b.runs]
    if paired_seeds(a, b) is not None:
        return None
    if None in seeds_a or None in seeds_b:
        return "a run's seed is not known"
    if len(set(seeds_a)) < len(seeds_a) or len(set(seeds_b)) < len(seeds_b):
        return "a side holds a seed more than once"
    return "one seed a side" if seeds_a == seeds_b else "the sides do not hold the same seeds"


def value(row: dict[str, Any], figure: str) -> float | None:
    """A run's figure: exact match, steps, seconds (misses at the budget), or 1/0 reached."""
    if figure == "success":
        return None if row["reached"] is None else float(row["reached"])
    found = row.get({"steps": "steps", "seconds": "wall_s"}.get(figure, figure))
    return found if isinstance(found, (int, float)) and not isinstance(found, bool) else None


def compare_sides(a: Side, b: Side, effects: dict[str, float]) -> dict[str, Any]:
    """The whole comparison, as `minitfm compare --json` prints it."""
    seeds = paired_seeds(a, b)
    figures = [compare_figure(figure, a, b, seeds, effects.get(figure)) for figure in FIGURES]
    one_sweep = a.sweep is not None and a.sweep == b.sweep  # then its keys name A and B
    exempt = tuple(key for key in a.swept if key in b.swept) if one_sweep else ()
    notes = (settings_note(a.runs, b.runs, exempt), timing_note(a.runs, b.runs))
    return {"a": a.as_dict(), "b": b.as_dict(), "differs": differences(a, b),
            "paired": seeds is not None,
            "seeds": seeds, "unpaired": unpaired_why(a, b), "alpha": ALPHA, "power": POWER,
            "figures": [f for f in figures if f is not None], "notes": [n for n in notes if n]}


def differences(a: Side, b: Side) -> dict[str, dict[str, list]]:
    """The settings in which A and B differ, from their runs' resolved configs: key -> {"a":
    A's values, "b": B's values}, each in order of its runs, once each; a key in which the sides
    hold the same values (however their runs vary in it) is not one. Never the seed, which
    differs only from run to run, nor where runs go and their threads (`runs.HIDDEN_KEYS`)."""
    keys = dict.fromkeys(key for side in (a, b) for run in side.runs for key in run["config"])
    found = {}
    for key in keys:
        if key in (*HIDDEN_KEYS, "seed"):
            continue
        values = [{repr(v): v for v in (run["config"].get(key) for run in side.runs)}
                  for side in (a, b)]
        if values[0].keys() != values[1].keys():
            found[key] = {"a": list(values[0].values()), "b": list(values[1].values())}
    return found


def compare_figure(figure: str, a: Side, b: Side, seeds: list[int] | None,
                   effect: float | None) -> dict[str, Any] | None:
    """One figure: both sides, A - B with its interval, the test, what n could detect and what
    a difference needs; None for the success rate of runs without a target."""
    if figure == "success" and any(r["reached"] is None for r in [*a.runs, *b.runs]):
        return None
    if seeds is not None:
        by_seed = [({r["seed"]: value(r, figure) for r in side.runs}) for side in (a, b)]
        kept = [s for s in seeds if None not in (by_seed[0][s], by_seed[1][s])]
        xa, xb = [by_seed[0][s] for s in kept], [by_seed[1][s] for s in kept]
    else:
        xa = [v for v in (value(r, figure) for r in a.runs) if v is not None]
        xb = [v for v in (value(r, figure) for r in b.runs) if v is not None]
    if not xa or not xb:
        return {"figure": figure, "name": FIGURES[figure],
                "verdict": "not measured on both sides (no figure in the runs' files)"}
    rate = figure == "success"
    if rate:
        sides = [rate_interval(int(sum(x)), len(x)) for x in (xa, xb)]
        difference = newcombe((int(sum(xa)), len(xa)), (int(sum(xb)), len(xb)))
    else:
        sides = [mean_interval(xa), mean_interval(xb)]
        difference = mean_interval([x - y for x, y in zip(xa, xb)]) if seeds is not None \
            else welch_interval(xa, xb)
    p, how = paired_test([x - y for x, y in zip(xa, xb)]) if seeds is not None \
        else unpaired_test(xa, xb)
    found = {"figure": figure, "name": FIGURES[figure], "a": sides[0].as_dict(),
             "b": sides[1].as_dict(), "difference": difference.mean, "lo": difference.lo,
             "hi": difference.hi, "interval": interval_name(rate, seeds is not None),
             "test": f"permutation test, {'paired by seed' if seeds else 'unpaired'} ({how})",
             "p_value": p, "n": [len(xa), len(xb)]}
    found.update(sizes(figure, xa, xb, seeds is not None, effect, difference))
    found["resolution"] = resolution(figure, [*a.runs, *b.runs])
    if found["effect_from"] == "observed" and found["effect_size"] < found["resolution"]:
        found.update(seeds_needed=None, seeds_needed_power=None)  # no difference to chase
    if figure == "seconds":
        found["ran_first"] = ran_first(a.runs, b.runs)
    return {**found, "verdict": verdict(found), "seeds_line": seeds_line(found)}


def interval_name(rate: bool, paired: bool) -> str:
    """Which 95% interval of A - B."""
    if rate:
        return "Newcombe's hybrid score interval (1998)"
    return "Student's t of the paired differences" if paired else "Welch's t (1947)"


def sizes(figure: str, xa: list[float], xb: list[float], paired: bool, effect: float | None,
          difference: Interval) -> dict[str, Any]:
    """What these n could detect (`smallest_detectable`), the seeds a side a difference needs
    (`seeds_needed` for `effect_size`: --effect, else the observed one), both in words."""
    na, nb = len(xa), len(xb)
    if figure == "success":
        pooled = mean([*xa, *xb])
        smallest = detectable_rate(pooled, na, nb)
        size = effect if effect is not None else abs(difference.mean)
        base = mean(xb)
        other = base + size if base + size <= 1 else base - size
        needed = seeds_needed_rate(other, base) if size > 0 and 0 <= other <= 1 else None
        sd = None
    else:
        sd = pooled_sd(xa, xb)
        smallest = detectable(sd, na, nb) if sd is not None else None
        size = effect if effect is not None else abs(difference.mean)
        needed = seeds_needed(sd, size) if sd is not None and size > 0 else None
    floor = seeds_for_any_test(paired)  # fewer, and the test can never reach ALPHA
    return {"smallest_detectable": smallest, "pooled_sd": sd, "effect_size": size,
            "effect_from": "--effect" if effect is not None else "observed",
            "seeds_needed": None if needed is None else max(needed, floor),
            "seeds_needed_power": needed,
            "smallest_p": smallest_p(na, None if paired else nb),
            "seeds_for_any_test": floor}
