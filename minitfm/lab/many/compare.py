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
one, or `--effect`). The maths is `stats.py`'s. No torch here.
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
from minitfm.lab.many.results import by_configuration
from minitfm.lab.many.runs import HIDDEN_KEYS, SWEEP_FILE, find_runs, short_label
from minitfm.lab.many.seeds import ended, named, run_outcome
from minitfm.lab.many.stats import (
    ALPHA,
    MAX_SEEDS,
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
from minitfm.run.files import open_run_file, unreadable
from minitfm.run.rundir import DONE

FIGURES = {"exact_match": "held-out exact match", "steps": "steps to target",
           "seconds": "seconds to target", "success": "success rate"}
# Besides task.*: what the steps, seconds and success rate count to and how exact match is found.
MEASURED_BY = ("train.target_exact_match", "train.steps", "train.eval_samples")
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

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "n": len(self.runs), "runs": [r["run"] for r in self.runs],
                "left_out": self.left_out, "differ_in": self.mixed}


def make_side(name: str, label: str, run_dirs: list[Path], swept: tuple[str, ...] = ()) -> Side:
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
    return Side(name, label, done, left, mixed, swept)


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
    chosen = labels[int(which) - 1] if which.isdigit() and 1 <= int(which) <= len(labels) \
        else next((label for label in labels if which in (label, short_label(label),
                                                           values_of(label))), None)
    if chosen is None:
        known = ", ".join(quote(named(label)) for label in labels[:6])
        raise MinitfmError(f"{name} ({quote(which)}) is no configuration of "
                           f"{quote(shown_path(folder))}: give its # in the sweep's table "
                           f"(1..{len(labels)}) or its label: {known}")
    label = f"#{labels.index(chosen) + 1} {named(chosen)}"
    swept = tuple(part.partition("=")[0] for part in chosen.split(", ") if "=" in part)
    return make_side(name, label, [folder / row["run"] for row in groups[chosen]], swept)


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
    return {"a": a.as_dict(), "b": b.as_dict(), "paired": seeds is not None,
            "seeds": seeds, "alpha": ALPHA, "power": POWER,
            "figures": [f for f in figures if f is not None],
            "notes": [n for n in (settings_note(a, b), timing_note(a, b)) if n]}


def settings_note(a: Side, b: Side) -> str | None:
    """The settings the figures depend on (`MEASURED_BY`, the evaluation) in which A and B
    differ, each side's values; None when they agree. Keys the two configurations of a sweep
    are named by are what the comparison is about: not noted."""
    keys = dict.fromkeys(key for side in (a, b) for run in side.runs for key in run["config"]
                         if key.startswith("task.") or key in MEASURED_BY)
    differ = []
    for key in [*keys, "evaluation"]:
        if key in a.swept and key in b.swept:
            continue
        shown = [side_values(side, key) for side in (a, b)]
        if shown[0] != shown[1]:
            differ.append(f"{key} ({shown[0]} vs {shown[1]})")
    if not differ:
        return None
    return (f"A and B differ in settings their figures depend on: {'; '.join(differ)}; a "
            f"difference may come from these, not only from what A and B compare")


def side_values(side: Side, key: str) -> str:
    """A side's values of a config key (or its runs' `evaluation`), in order, once each."""
    found = [run.get(key) if key == "evaluation" else run["config"].get(key)
             for run in side.runs]
    return ", ".join(dict.fromkeys(str(value) for value in found))


def timing_note(a: Side, b: Side) -> str | None:
    """The conditions each side's seconds were measured under (a sweep's jobs side by side,
    the threads); None when the sides' conditions are the same."""
    shown = [", ".join(dict.fromkeys(conditions(run) for run in side.runs)) for side in (a, b)]
    if shown[0] == shown[1]:
        return None
    return (f"seconds to target were measured under different conditions (A: {shown[0]}; "
            f"B: {shown[1]}): their difference is no timing of A against B; compare steps, "
            f"or time runs alone")


def conditions(run: dict[str, Any]) -> str:
    """How a run's seconds were measured: beside other jobs of a sweep, or alone; threads."""
    folder = Path(run["run_dir"]).parent
    threads = run["config"].get("threads")
    where = (f"jobs side by side in the sweep {shown_path(folder)}"
             if (folder / SWEEP_FILE).is_file() else "a run alone")
    return f"{where}, threads={threads}"


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


def amount(figure: str, number: float, sign: bool = False, unit: bool = True) -> str:
    """A figure's number in its unit: `+1.2%`, `31 steps`, `4.2 s` (`unit` False: `31`)."""
    plus = "+" if sign else ""
    if figure in ("exact_match", "success"):
        return f"{number:{plus}.1%}"
    if figure == "steps":
        return f"{number:{plus}.0f}" + (" steps" if unit else "")
    return f"{number:{plus}.1f}" + (" s" if unit else "")


def ends(figure: str, lo: float | None, hi: float | None) -> str:
    """An interval's ends, signed, `[-0.2%, +0.5%]` or `[+17, +48]` (empty without one)."""
    if lo is None:
        return ""
    return f"[{amount(figure, lo, True, False)}, {amount(figure, hi, True, False)}]"


def verdict(found: dict[str, Any]) -> str:
    """What the data supports about one figure, in one sentence: the test's answer (or that it
    cannot give one with these n), and an interval that excludes 0 when the test does not
    confirm it."""
    figure, (na, nb) = found["figure"], found["n"]
    n = f"n = {na}" if na == nb else f"n = {na} and {nb}"
    if found["p_value"] < ALPHA:
        interval = ends(figure, found["lo"], found["hi"])
        return (f"a difference: A - B = {amount(figure, found['difference'], True)}"
                f"{' ' + interval if interval else ''}, p = {found['p_value']:.2g}")
    if found["smallest_p"] > ALPHA:
        reached = " (these runs reach it)" \
            if found["p_value"] <= found["smallest_p"] * (1 + 1e-9) else ""
        return (f"the test cannot decide with {n}: its smallest possible p-value, "
                f"{found['smallest_p']:.2g}, is above {ALPHA}{reached}, so it needs at least "
                f"{found['seeds_for_any_test']} seeds a side{unconfirmed(found)}")
    smallest = found["smallest_detectable"]
    if smallest is None:
        what = "not known: " + ("a rate this close to 0 or 1 needs more seeds" if figure ==
                                "success" else "each side needs 2 runs to show its spread")
    elif found.get("pooled_sd") == 0:
        what = "any difference, as the runs do not vary"
    else:
        what = amount(figure, smallest)
    return f"no difference detectable with {n} (smallest detectable: {what}){unconfirmed(found)}"


def unconfirmed(found: dict[str, Any]) -> str:
    """`; the 95% interval ... excludes 0, but ...` when the interval of A - B excludes 0 and
    the test does not confirm it (empty otherwise): the interval rests on what the permutation
    test does not assume."""
    lo, hi, (na, nb) = found["lo"], found["hi"], found["n"]
    if lo is None or lo <= 0 <= hi:
        return ""
    runs = f"{na} seeds" if "paired by seed" in found["test"] else \
        f"{na} runs a side" if na == nb else f"{na} and {nb} runs"
    rests = (f"it is a large-sample approximation, rough at {runs}" if found["figure"] ==
             "success" else f"it assumes normally distributed figures, which {runs} cannot show")
    return f"; the 95% interval {ends(found['figure'], lo, hi)} excludes 0, but {rests}"


def seeds_line(found: dict[str, Any]) -> str:
    """How many seeds a difference of the effect size needs, in one line."""
    figure, size = found["figure"], found["effect_size"]
    if size == 0:
        return "no difference observed: give --effect to size one"
    which = "as --effect" if found["effect_from"] == "--effect" else "the observed one"
    needed = found["seeds_needed"]
    if needed is None:
        return (f"a difference of {amount(figure, size)} ({which}) cannot be sized here"
                + (f": it needs more than {MAX_SEEDS:,} seeds a side"
                   if found.get("pooled_sd") is not None or figure == "success"
                   else ": each side needs 2 runs to show its spread"))
    floor, power = found["seeds_for_any_test"], found.get("seeds_needed_power")
    why = (f" (the test needs at least {floor} to reach p < {ALPHA} at all; the power estimate "
           f"alone says {power})" if power is not None and power < floor else "")
    return (f"a difference of {amount(figure, size)} ({which}) needs {needed} seeds a side to "
            f"be found {POWER:.0%} of the time at alpha {ALPHA}{why}")
