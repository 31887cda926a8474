"""A sweep's grid: `KEY=V1,V2` items read in Hydra's multirun syntax, and every run of it
validated before anything is written.

`model.positional=rope,alibi seed=0,1` is four runs; a key with one value is a fixed override of
every run. Each run gets a file-name-safe id from its values (`positional=rope,seed=0`), the
name of its folder in the sweep folder; the sweep folder's name says what the grid changes in
its config file (`grid_text`: `lr0.005`). No torch here.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minitfm.catalog import TASKS, Shortfall, position_shortfall
from minitfm.config import (
    Config,
    check_given_once,
    flatten,
    load_config,
    parse_override,
    split_key_value,
)
from minitfm.errors import ConfigError, MinitfmError, quote
from minitfm.lab.many.runs import HIDDEN_KEYS, short_names
from minitfm.lab.many.space import is_search
from minitfm.lab.options import MAX_LEN as MAX_EVAL_LEN  # `minitfm eval --max-len`'s bound
from minitfm.run.limits import check_fits, training_parts

MAX_RUNS = 10_000  # a grid larger than this is a typo, not an experiment on one machine
NAME_MAX = 255  # bytes of one file name (Linux and macOS file systems)


@dataclass
class Grid:
    """What a sweep command asks for: a base config, swept keys and fixed overrides."""

    config: str | None
    swept: list[tuple[str, list[str]]]  # (key, value texts) in the order given
    fixed: list[str]  # KEY=VALUE applied to every run
    search: dict[str, Any] | None = None  # a search's space and sampler (`search.Search.spec`)

    def spec(self) -> dict[str, Any]:
        """The grid as stored in `sweep.json`: what makes two sweeps the same sweep."""
        config = str(Path(self.config).resolve()) if self.config else None
        searched = {"search": self.search} if self.search is not None else {}
        return {"config": config, "swept": [[k, v] for k, v in self.swept], "fixed": self.fixed,
                **searched}

    @property
    def searched(self) -> list[str]:
        """A search's keys (none in a grid)."""
        return [key for key, _ in (self.search or {}).get("space", [])]


@dataclass
class RunSpec:
    """One run of the grid: its values of the swept keys, overrides, config and directory."""

    id: str
    choice: dict[str, str]  # swept key -> value text
    overrides: list[str]
    cfg: Config
    run_dir: Path = Path()  # set once the sweep folder is chosen
    # The fixed overrides that change the config file's value (`changed_fixed`), as given.
    fixed: dict[str, str] = field(default_factory=dict)
    configuration: str | None = None  # a search's trial (`trial=3, lr=0.01`); else its choice

    @property
    def named(self) -> str:
        """The run as a message names it: `the run 'seed=0'`; `the run` in a grid of one run
        (no values of its own: its folder is `run`)."""
        return f"the run {quote(self.id)}" if self.choice else "the run"

    @property
    def label(self) -> str:
        """The configuration this run belongs to: its choice without the seed (a search's
        trial, which may draw the values of another)."""
        if self.configuration is not None:
            return self.configuration
        return ", ".join(f"{k}={v}" for k, v in self.choice.items() if k != "seed") or "all"


def parse_grid(items: list[str], seeds: str | None) -> tuple[list, list[str]]:
    """`KEY=V1,V2` items (and `--seeds`) -> (swept keys with their values, fixed overrides)."""
    check_given_once(items, sweep=True)  # fixed twice, swept twice, or both: which is meant?
    swept, fixed = [], []
    for item in [*items, *([f"seed={parse_seeds(seeds)}"] if seeds is not None else [])]:
        split = split_key_value(item)
        if seeds is not None and split is not None and split[0] == "seed" and item in items:
            raise ConfigError(f"{item} and --seeds {seeds} both set the seed: give the seeds "
                              f"once, e.g. --seeds {seeds}")
        if split is None:
            raise ConfigError(f"grid item '{item}' must look like KEY=V1,V2,..., e.g. "
                              f"model.positional=rope,alibi")
        key, text = split
        if key == "seed" and is_search(text):
            raise ConfigError(f"{item}: the seeds are a list every trial of a search runs "
                              f"(--seeds 0..3), not a range to search")
        if key == "seed" and ".." in text:  # a range of seeds is --seeds' to read
            raise ConfigError(f"{item}: seed= takes seeds one by one (seed=0,1,2); give a "
                              f"range as --seeds {text.strip()}")
        if key == "threads":
            raise ConfigError(f"grid item '{item}': sweep sets threads per job; use --threads N "
                              f"(and --jobs N)")
        values = [v.strip() for v in text.split(",")]
        if not any(values) or (len(values) > 1 and not all(values)):
            raise ConfigError(f"grid item '{item}' has an empty value: give {key}=V1,V2,... "
                              f"(null for None)")
        if len(values) == 1:
            fixed.append(f"{key}={values[0]}")
        else:
            swept.append((key, values))
    check_size(swept)
    for key, values in swept:
        check_distinct(key, values)
    return swept, fixed


def parse_seeds(text: str) -> str:
    """`--seeds`: seeds and ranges, comma-separated, as `seed=` values (`0..3,8` -> `0,1,2,3,8`);
    a range is written as `--eval-lengths` writes one, A..B with both ends included."""
    if is_search(text):
        raise ConfigError(f"--seeds ({quote(text)}) is a list every trial of a search runs "
                          f"(e.g. 0..3 or 0,1), not a range to search")
    values = []
    for part in text.split(","):
        dashed = re.fullmatch(r"\s*(-?\d+)\s*-\s*(-?\d+)\s*", part)
        if dashed:  # `0-7`: a range written as another tool writes one
            raise ConfigError(f"--seeds ({quote(text)}): write a range as {dashed[1]}..{dashed[2]} "
                              f"(A..B, both ends included), not {quote(part.strip())}")
        if ".." not in part:
            values.append(part.strip())  # checked as a seed by the config, like seed=0,1
            continue
        found = re.fullmatch(r"\s*(-?\d{1,19})\s*\.\.\s*(-?\d{1,19})\s*", part)
        lo, hi = (int(n) for n in found.groups()) if found else (1, 0)
        if lo > hi:
            raise ConfigError(f"--seeds ({quote(text)}): {quote(part.strip())} is no range A..B "
                              f"with A <= B; give seeds and ranges such as 0..7 or 0,1,2")
        if hi - lo >= MAX_RUNS:
            raise ConfigError(f"--seeds ({quote(text)}): {quote(part.strip())} is "
                              f"{hi - lo + 1:,} seeds, at most {MAX_RUNS:,} runs in a grid")
        values.extend(str(seed) for seed in range(lo, hi + 1))
    return ",".join(values)


def check_size(swept: list[tuple[str, list[str]]]) -> None:
    """Refuse a grid of more than MAX_RUNS runs, counted before any of them is made."""
    total = math.prod(len(values) for _, values in swept)
    if total > MAX_RUNS:
        factors = " x ".join(f"{len(values):,} {key}" for key, values in swept)
        raise ConfigError(f"the grid has {total:,} runs ({factors}): at most {MAX_RUNS:,}; "
                          f"sweep fewer values, or split it into several sweeps")


def check_distinct(key: str, values: list[str]) -> None:
    """Refuse a value given twice in one axis (`seed=0,0`, `seed=0,00`): two runs, one config."""
    seen: dict[str, str] = {}
    for text in values:
        try:  # compared as parsed (`00` is 0); a value that does not parse fails later, per run
            same = json.dumps(parse_override(f"{key}={text}")[1])
        except ConfigError:
            same = text
        if same in seen:
            both = f" ({quote(seen[same])} and {quote(text)})" if seen[same] != text else ""
            raise ConfigError(f"grid key '{key}' gives the value {quote(text)} twice{both}: "
                              f"give each value once")
        seen[same] = text


def run_id(choice: dict[str, str]) -> str:
    """A file-name-safe id such as `positional=rope,random_positions=64,seed=0`."""
    names = short_names(list(choice))
    text = ",".join(f"{names[k]}={v}" for k, v in choice.items()) or "run"
    # Escaped, not replaced (`d/a.tsv` -> `d%2Fa.tsv`, `%` itself too): two values never
    # share a folder, as `d/a.tsv` and `d_a.tsv` did when both became `d_a.tsv`.
    return re.sub(r"[^A-Za-z0-9_.,=+-]", escape, text)


def escape(found: re.Match) -> str:
    """One character as `%XX` per byte of its UTF-8 form."""
    return "".join(f"%{byte:02X}" for byte in found.group().encode("utf-8"))


def changed_fixed(grid: Grid, cfg: Config) -> dict[str, str]:
    """The fixed overrides that change a value of the config file (of the built-in default
    without one), key -> value text as given; `cfg` is a run of the grid. Never the seed (an
    axis, not a setting) nor where the runs go and their threads (`runs.HIDDEN_KEYS`)."""
    try:
        before = flatten(load_config(grid.config).model_dump(mode="json"))
    except ConfigError:  # a file valid only with its overrides: each of them changes it
        before = {}
    after = flatten(cfg.model_dump(mode="json"))  # None is "null" here, never None
    changed = {}
    for item in grid.fixed:
        key, text = split_key_value(item)
        if key not in (*HIDDEN_KEYS, "seed") and after.get(key) != before.get(key):
            changed[key] = text.strip()
    return changed


def grid_text(grid: Grid, fixed: dict[str, str], room: int) -> str:
    """What a sweep folder's name says of its grid, at most `room` bytes: each swept key by its
    short name (`runs.short_names`) followed by its values (`lr0.01,0.005`), then each fixed
    override in `fixed` followed by its value (`lr0.005`), joined by `-`, characters a file name
    should not hold escaped as in a run's id; never the seed. Keys that do not fit are left
    out from the end and counted in a last part, `and2more`; empty when nothing is changed."""
    given = [*((key, ",".join(values)) for key, values in grid.swept if key != "seed"),
             *((key, "") for key in grid.searched), *fixed.items()]
    names = short_names([key for key, _ in given])
    parts = [re.sub(r"[^A-Za-z0-9_.,=+-]", escape, f"{names[key]}{text}") for key, text in given]
    if grid.search is not None:  # `search-lr-warmup_steps-...`: the keys it searches
        parts.insert(0, "search")
    for kept in range(len(parts), -1, -1):
        cut = [f"and{len(parts) - kept}more"] if kept < len(parts) else []
        text = "-".join([*parts[:kept], *cut])
        if len(text.encode()) <= room:
            return text
    return ""  # not even the mark fits (a --name of the longest length)


def plan_runs(grid: Grid, threads: int,
              skip_invalid: bool = False) -> tuple[list[RunSpec], list[str]]:
    """Every run of the grid, each config validated: one bad value refuses the whole grid,
    unless `skip_invalid` (then the second list says which were left out, and why)."""
    keys = [key for key, _ in grid.swept]
    runs, skipped = [], []
    for values in itertools.product(*(v for _, v in grid.swept)):
        choice = dict(zip(keys, values))
        overrides = [*grid.fixed, *(f"{k}={v}" for k, v in choice.items())]
        try:
            cfg = load_config(grid.config, [*overrides, f"threads={threads}"])
            check_trained_positions(cfg)
            check_fits(training_parts(cfg), "training")  # a MinitfmError: never skipped
        except ConfigError as err:
            if not skip_invalid or not choice:
                where = f" (in the run {run_id(choice)})" if choice else ""
                raise ConfigError(*(f"{problem}{where}" for problem in err.problems())) \
                    from None
            skipped.append(f"{run_id(choice)}: {err}")
            continue
        runs.append(RunSpec(run_id(choice), choice, overrides, cfg))
    if not runs:
        raise ConfigError(f"no valid run in the grid: {skipped[0]}")
    check_distinct_runs(runs)
    fixed = changed_fixed(grid, runs[0].cfg)  # the same in every run
    for spec in runs:
        spec.fixed = fixed
    return runs, skipped


def check_trained_positions(cfg: Config) -> None:
    """What training refuses as it starts: learned positions too few for task.max_len."""
    short = stated_shortfall(cfg, cfg.task.max_len)
    if short is not None:
        raise ConfigError(f"model.max_len ({cfg.model.max_len}) is too small for task.max_len "
                          f"({cfg.task.max_len}): sequences need {short.needed} positions; "
                          f"raise model.max_len")


def stated_shortfall(cfg: Config, hi: int) -> Shortfall | None:
    """`catalog.position_shortfall` for inputs of up to `hi` symbols, as the config states them
    (pairs: the sources; their targets are known only from the files); randomized positions are
    checked as a run starts."""
    return position_shortfall(cfg.model, TASKS[cfg.task.name].positions_for_inputs(hi))


def check_distinct_runs(runs: list[RunSpec]) -> None:
    """Refuse two runs with one config (`lr=1,1.0`, `./d.tsv,d.tsv`) and ids too long."""
    seen: dict[str, str] = {}
    for spec in runs:
        if len(f"{spec.id}.log".encode()) > NAME_MAX:
            key = max(spec.choice, key=lambda k: len(spec.choice[k]))
            raise ConfigError(f"the run {quote(spec.id)} needs a file name of "
                              f"{len(spec.id.encode()) + 4} bytes, more than {NAME_MAX}: give "
                              f"{key} shorter values (a shorter file name, say)")
        same = json.dumps(spec.cfg.model_dump(mode="json"), sort_keys=True)
        if same in seen:
            raise ConfigError(f"the runs {quote(seen[same])} and {quote(spec.id)} have the same "
                              f"config: give each value once")
        seen[same] = spec.id


def parse_lengths(text: str) -> tuple[int, int]:
    """`17..32` -> (17, 32)."""
    found = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", text)
    # A digit string longer than 9 is beyond any bound (and int() of a huge one is slow).
    lo, hi = (int(n) if len(n) <= 9 else math.inf for n in found.groups()) if found else (0, 0)
    if not found or lo < 1 or lo > hi:
        raise MinitfmError(f"--eval-lengths ({quote(text)}) must look like A..B with "
                           f"1 <= A <= B, e.g. 17..32")
    if hi > MAX_EVAL_LEN:
        raise MinitfmError(f"--eval-lengths ({quote(text)}) may reach at most {MAX_EVAL_LEN:,} "
                           f"(as eval --max-len): give a smaller B")
    return lo, hi
