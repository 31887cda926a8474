"""`minitfm compare`'s sentences: what the data supports about each figure, in words.

`verdict`: the test's answer, or that it cannot give one with these n; an interval that excludes
0 when the test does not confirm it; for the seconds, when one side's runs all ran before the
other's. `seeds_line`: how many seeds a difference needs, or that the observed one is too small
to chase (below the figure's `resolution`). Each reads a figure as `compare.compare_figure`
finds it. No torch here.
"""

from __future__ import annotations

from typing import Any

from minitfm.lab.many.stats import ALPHA, MAX_SEEDS, POWER

# The smallest observed difference worth sizing in seeds: what the table's 0.1% and 0.1 s round
# away, a step (exact match: one sequence of the evaluation, where its size is known; a success
# rate's differences are whole runs: any but 0 is worth it).
RESOLUTION = {"exact_match": 0.0005, "steps": 1.0, "seconds": 0.05, "success": 0.0}


def resolution(figure: str, runs: list[dict[str, Any]]) -> float:
    """The smallest difference of a figure worth sizing in seeds (`RESOLUTION`); for exact
    match, one sequence of the largest evaluation the runs name (the finest they resolve)."""
    samples = [r["samples"] for r in runs if isinstance(r.get("samples"), int)
               and r["samples"] > 0]
    if figure == "exact_match" and samples:
        return 1 / max(samples)
    return RESOLUTION[figure]


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


def too_small(found: dict[str, Any]) -> str:
    """`A - B = +0.02%, less than one held-out sequence in 1,000`: an observed difference below
    its figure's `resolution`, shown finer than the table shows it."""
    figure, difference, least = found["figure"], found["difference"], found["resolution"]
    if figure == "exact_match":
        below = f"{least:.2%}" if least == RESOLUTION[figure] else \
            f"one held-out sequence in {round(1 / least):,}"
        return f"A - B = {difference:+.2%}, less than {below}"
    if figure == "steps":
        return f"A - B = {difference:+.2f} steps, less than a step"
    return f"A - B = {difference:+.3f} s, less than {least} s"


def verdict(found: dict[str, Any]) -> str:
    """What the data supports about one figure, in one sentence: `answer`; for the seconds,
    when one side's runs all ran before the other's, that the load of the machine then is in
    them too."""
    first = found.get("ran_first")
    if first is None:
        return answer(found)
    other = "B" if first == "A" else "A"
    return (f"{answer(found)}; {first}'s runs ran before {other}'s: the seconds also measure "
            f"the machine's load then")


def answer(found: dict[str, Any]) -> str:
    """The test's answer (or that it cannot give one with these n), and an interval that
    excludes 0 when the test does not confirm it."""
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
    if found["effect_from"] == "observed" and size < found["resolution"]:
        return f"no difference observed to chase ({too_small(found)}): give --effect to size one"
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
