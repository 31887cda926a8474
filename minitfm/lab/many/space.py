"""A search's space: the ranges of a sweep that searches, read in the override grammar of Hydra's
sweepers, each key a `Dimension` that Optuna samples (`distribution`).

    train.lr=tag(log,interval(1e-3,3e-2))     a float, sampled on a log scale
    train.lr=interval(1e-3,3e-2)              a float, uniform
    train.warmup_steps=int(interval(20,120))  an int, both ends included
    train.warmup_steps=range(20,121,20)       20, 40, ..., 120 (as Python's range: stop excluded)
    model.positional=choice(sinusoidal,rope)  one of these values

A sweep with any of them is a search (`search.py`); there, a plain list `KEY=a,b` is a choice too
(as in Hydra's Optuna sweeper), while the seeds stay what they are in a grid: every trial is run
with each of them. A sampled float goes to its run's config as Optuna drew it (so that the
study's value finds the run: `runs --where train.lr=...`), and the tables show it with SHOWN
digits. No Optuna here: it is imported by `distribution` and `search.py` only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from minitfm.errors import ConfigError, quote

FUNCTIONS = ("choice", "range", "interval", "int", "tag")
SHOWN = 4  # significant digits of a sampled float in the tables (its run has it whole)
MAX_RANGE = 10_000  # values of one range(...): more is a typo (the grid's MAX_RUNS)
SAMPLERS = ("tpe", "random", "grid")  # --sampler: how a search draws its trials
PRUNERS = ("none", "median", "forecast")  # --prune: how it stops hopeless ones (`pruning.py`)


@dataclass(frozen=True)
class Dimension:
    """One searched key: floats or ints between `low` and `high` (both included; with `step`,
    on its grid; `log`: sampled on a log scale), or one of `choices` (texts as given)."""

    key: str
    text: str  # the value as given: `tag(log,interval(1e-3,3e-2))`
    kind: str  # "float", "int" or "choice"
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False
    choices: tuple[str, ...] = ()

    def values(self) -> list[str] | None:
        """Every value as an override's text, where there are finitely many (None: a float
        interval)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return [str(v) for v in range(int(self.low), int(self.high) + 1, int(self.step or 1))]
        if self.step is not None:
            count = int(round((self.high - self.low) / self.step)) + 1
            return [number_text(self.low + i * self.step) for i in range(count)]
        return None

    def ends(self) -> list[str]:
        """The values a search checks before its first trial: each choice, else both ends."""
        values = self.values()
        if values is not None and self.kind == "choice":
            return values
        return [self.value_text(self.low), self.value_text(self.high)] if self.kind == "int" \
            else [number_text(self.low), number_text(self.high)]

    def value_text(self, value: float | int | str) -> str:
        """A sampled value as its run's override takes it (`0.01234`, `60`, `rope`)."""
        if self.kind == "choice":
            return str(value)
        if self.kind == "int":
            return str(int(value))
        return repr(float(value))  # the float Optuna drew, whole

    def distribution(self):
        """This dimension as Optuna samples it."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind == "choice":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log,
                                   step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


def number_text(value: float) -> str:
    """A float as YAML 1.2 reads it back, the same float (`0.006466422717414559`, `1e-05`,
    `2.0`), less the noise of float sums (15 significant digits: `0.3`, not
    `0.30000000000000004`)."""
    return repr(float(f"{value:.15g}"))


def shown(text: str) -> str:
    """A value as a table shows it: a float with SHOWN digits (`0.006466`), the rest as is."""
    try:
        value = float(text)
    except ValueError:
        return text
    return text if re.fullmatch(r"-?\d+", text) else f"{value:.{SHOWN}g}"


def is_search(text: str) -> bool:
    """Whether a grid value is a range or choice to search (`interval(...)`, `interval(1,2`
    too, and a misspelt one, `intervall(1,2)`: `parse_dimension` says what is wrong)."""
    found = re.match(r"\s*([a-z]+)\s*\(", text)
    return bool(found) and (found[1] in FUNCTIONS or bool(misspelt(found[1])))


def misspelt(name: str) -> str | None:
    """The function of the grammar `name` is a near miss of (`intervall`, `rnage`), if any."""
    import difflib

    close = difflib.get_close_matches(name, FUNCTIONS, n=1, cutoff=0.75)
    return close[0] if close and close[0] != name else None


def parse_dimension(key: str, text: str) -> Dimension:
    """`KEY=<function>(...)` as a Dimension; a one-line ConfigError names what is wrong."""
    item = f"{key}={text.strip()}"
    try:
        call = parse_call(text.strip())
    except ValueError as err:
        raise ConfigError(f"{item}: {err}; e.g. {key}=interval(0.001,0.03), "
                          f"{key}=range(20,121,20) or {key}=choice(a,b)") from None
    return dimension(key, text.strip(), call, item)


def parse_call(text: str):
    """`name(a, b(c))` -> ("name", ["a", ("b", ["c"])]); a plain value stays its text."""
    found = re.fullmatch(r"([a-z]+)\s*\((.*)\)", text, flags=re.DOTALL)
    if not found:
        if re.match(r"[a-z]+\s*\(", text):
            raise ValueError("a '(' is never closed")
        return text
    if found[1] not in FUNCTIONS:
        near = misspelt(found[1])
        hint = f" (did you mean {near}?)" if near else ""
        raise ValueError(f"{quote(found[1])} is none of {', '.join(FUNCTIONS)}{hint}")
    args, depth, start, inner = [], 0, 0, found[2]
    for i, ch in enumerate(inner):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            raise ValueError("a ')' closes nothing")
        if ch == "," and depth == 0:
            args.append(inner[start:i])
            start = i + 1
    if depth:
        raise ValueError("a '(' is never closed")
    args.append(inner[start:])
    parts = [part.strip() for part in args]
    if parts == [""]:
        parts = []
    if any(not part for part in parts):
        raise ValueError(f"{found[1]}(...) has an empty argument")
    return found[1], [parse_call(part) for part in parts]


def dimension(key: str, text: str, call, item: str) -> Dimension:
    """A parsed call as a Dimension: its arguments checked (numbers, bounds, emptiness)."""
    if isinstance(call, str):
        raise ConfigError(f"{item}: give a range or a choice, e.g. interval(0.001,0.03)")
    name, args = call
    if name == "choice":
        if not args or any(not isinstance(a, str) for a in args):
            raise ConfigError(f"{item}: choice(...) takes one value or more, e.g. "
                              f"choice(sinusoidal,rope)")
        if len(set(args)) < len(args):
            raise ConfigError(f"{item}: choice(...) gives a value twice: give each once")
        if len(args) == 1:
            raise ConfigError(f"{item}: choice(...) of one value searches nothing: set it "
                              f"({key}={args[0]}), or give more values")
        return Dimension(key, text, "choice", choices=tuple(args))
    if name == "tag":
        tags = [a for a in args if isinstance(a, str)]
        inner = [a for a in args if not isinstance(a, str)]
        if tags != ["log"] or len(inner) != 1 or inner[0][0] not in ("interval", "int"):
            raise ConfigError(f"{item}: tag(log, ...) takes the tag log and one interval, "
                              f"e.g. tag(log,interval(0.001,0.03))")
        found = dimension(key, text, inner[0], item)
        if found.low <= 0:
            raise ConfigError(f"{item}: a log range needs bounds above 0 (its low end is "
                              f"{number_text(found.low)}): give a positive low end")
        if found.step not in (None, 1):
            raise ConfigError(f"{item}: a log range takes no step")
        return Dimension(key, text, found.kind, found.low, found.high, None, True)
    if name == "int":
        if len(args) != 1 or isinstance(args[0], str) or args[0][0] != "interval":
            raise ConfigError(f"{item}: int(...) takes one interval, e.g. "
                              f"int(interval(20,120))")
        low, high = numbers(args[0][1], 2, item, "interval(LOW,HIGH)")
        low, high = math.ceil(low), math.floor(high)
        if low >= high:
            raise ConfigError(f"{item}: the interval holds fewer than two whole numbers: give "
                              f"LOW < HIGH")
        return Dimension(key, text, "int", low, high, 1)
    if name == "interval":
        low, high = numbers(args, 2, item, "interval(LOW,HIGH)")
        if low >= high:
            raise ConfigError(f"{item}: the interval is empty: give LOW < HIGH")
        return Dimension(key, text, "float", low, high)
    return range_dimension(key, text, args, item)


def range_dimension(key: str, text: str, args: list, item: str) -> Dimension:
    """`range(START, STOP[, STEP])`: as Python's, STOP excluded; ints stay ints."""
    if len(args) not in (2, 3):
        raise ConfigError(f"{item}: range takes START,STOP or START,STOP,STEP, e.g. "
                          f"range(20,121,20)")
    start, stop, step = [*numbers(args, len(args), item, "range(START,STOP,STEP)"), 1][:3]
    if step <= 0:
        raise ConfigError(f"{item}: range's step must be above 0")
    count = math.ceil((stop - start) / step) if stop > start else 0
    if count < 1:
        raise ConfigError(f"{item}: the range is empty (STOP is excluded): give STOP > START")
    if count > MAX_RANGE:
        raise ConfigError(f"{item}: {count:,} values, at most {MAX_RANGE:,}: a larger step, or "
                          f"interval(...)")
    last = start + (count - 1) * step
    whole = all(isinstance(a, str) and re.fullmatch(r"-?\d+", a) for a in args)
    if count == 1:
        value = str(int(start)) if whole else number_text(start)
        raise ConfigError(f"{item}: the range holds one value ({value}) and searches nothing: "
                          f"set it ({key}={value}), or widen the range")
    return Dimension(key, text, "int" if whole else "float", start, last, step)


def numbers(args: list, count: int, item: str, form: str) -> list[float]:
    """`count` numeric arguments (finite), as floats (ints where written as ints)."""
    if len(args) != count or any(not isinstance(a, str) for a in args):
        raise ConfigError(f"{item}: give {form}")
    found = []
    for arg in args:
        try:
            value = int(arg) if re.fullmatch(r"-?\d{1,18}", arg) else float(arg)
        except ValueError:
            raise ConfigError(f"{item}: {quote(arg)} is not a number; give {form}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{item}: {quote(arg)} is not a finite number; give {form}")
        found.append(value)
    return found


def split_items(items: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(the searched items as (key, text), the others: the grid's fixed and swept items)."""
    from minitfm.config import split_key_value

    searched, rest = [], []
    for item in items:
        split = split_key_value(item)
        if split is not None and is_search(split[1]) and split[0] != "seed":
            searched.append((split[0], split[1]))
        else:
            rest.append(item)
    return searched, rest
