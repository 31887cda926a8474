"""A sweep's results: each run's evaluations read back, one row per run in results.jsonl and
results.csv, and results.png, the runs side by side; a row per configuration (its seeds
together, with 95% intervals: `seeds.py`) in configurations.jsonl, configurations.csv and
intervals.png.

Each run's evaluations are the `minitfm eval --json` reports its job wrote beside its checkpoints
(`eval-A-B.json`, one per length range: the trained range first), read by `curves.read_eval`:
one that is damaged counts as not done, and the sweep does it again. The files are replaced
atomically (`write_atomic`, the picture rule of `lab/pictures.py`). matplotlib is imported
inside functions; no torch here.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from minitfm.config import parse_override
from minitfm.errors import CheckpointError
from minitfm.lab.curves import read_eval, scan_metrics
from minitfm.lab.many.grid import RunSpec
from minitfm.lab.many.runs import short_label
from minitfm.lab.many.seeds import configuration_rows, reached, write_configurations
from minitfm.lab.pictures import LINE_COLOURS, line_style, save_png
from minitfm.run.files import to_json, write_atomic
from minitfm.run.summary import DONE, read_summary, run_status


def eval_ranges(spec: RunSpec, extra: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The trained range first, then each `--eval-lengths` range not equal to it."""
    trained = (spec.cfg.task.min_len, spec.cfg.task.max_len)
    return [trained, *(r for r in extra if r != trained)]


def eval_path(spec: RunSpec, lo: int, hi: int) -> Path:
    """Where a run's evaluation of input lengths lo..hi goes: `<run>/eval-<lo>-<hi>.json`."""
    return spec.run_dir / f"eval-{lo}-{hi}.json"


def run_line(spec: RunSpec, seconds: float) -> str:
    """`finished at step 350, exact match 99.1% (1..16) 3.2% (17..32), 21 s`."""
    summary = read_summary(spec.run_dir) or {}
    scores = " ".join(f"{em:.1%} ({span})" for span, em in exact_matches(spec).items()
                      if em is not None)
    return (f"{summary.get('status', '?')} at step {summary.get('step', '?')}, exact match "
            f"{scores}, {seconds:.0f} s")


def exact_matches(spec: RunSpec, ranges: list = ()) -> dict[str, float | None]:
    """Exact match per evaluated range, `"A..B"` -> fraction (None: not evaluated)."""
    found = {}
    extra = list(ranges) or [r for r in map(range_of, spec.run_dir.glob("eval-*-*.json")) if r]
    for lo, hi in eval_ranges(spec, sorted(extra)):
        report = read_eval(eval_path(spec, lo, hi))
        found[f"{lo}..{hi}"] = report["exact_match"] if report else None
    return found


def range_of(path: Path) -> tuple[int, int] | None:
    """`eval-17-32.json` -> (17, 32)."""
    found = re.fullmatch(r"eval-(\d+)-(\d+)\.json", path.name)
    return (int(found.group(1)), int(found.group(2))) if found else None


def per_length(spec: RunSpec, ranges: list) -> dict[int, float]:
    """Exact match per input length over every evaluated range."""
    lengths = {}
    for lo, hi in eval_ranges(spec, ranges):
        report = read_eval(eval_path(spec, lo, hi)) or {"per_length": {}}
        lengths.update({int(n): row["exact_match"] for n, row in report["per_length"].items()})
    return dict(sorted(lengths.items()))


def result_row(spec: RunSpec, ranges: list) -> dict[str, Any]:
    """One line of results.jsonl: the swept values and the fixed ones that change the config
    file's (`grid.changed_fixed`), how the run went, its exact matches."""
    summary = read_summary(spec.run_dir) or {}
    values = {key: parse_override(f"{key}={text}")[1]
              for key, text in {**spec.choice, **spec.fixed}.items()}
    status, target = run_status(spec.run_dir), spec.cfg.train.target_exact_match
    return {"run": spec.id, "run_dir": str(spec.run_dir), "seed": spec.cfg.seed, **values,
            "configuration": spec.label, "status": status,
            "steps": summary.get("step"), "wall_s": summary.get("wall_s"),
            "reached": reached(summary, target) if status in DONE else None,
            "budget": spec.cfg.train.steps, "target": target,
            "trained_lengths": [spec.cfg.task.min_len, spec.cfg.task.max_len],
            "exact_match": exact_matches(spec, ranges), "per_length": per_length(spec, ranges)}


def write_results(folder: Path, rows: list[dict[str, Any]], keys: list[str],
                  fixed: list[str] = (), first: list[str] = ()) -> None:
    """results.jsonl (everything), results.csv (no per-length figures) and results.png; a row
    per configuration in configurations.jsonl and .csv, and intervals.png (`seeds.py`). The
    tables have a column per swept key (`keys`), then per fixed key that changes the config
    file's value (`fixed`), each named by its full key (`train.lr`); results.csv has the row's
    `first` columns (a search's `trial`, ...) after its run."""
    lines = "".join(to_json(row) + "\n" for row in rows)
    write_atomic(folder / "results.jsonl", lines.encode("utf-8"))
    spans = range_labels(rows)
    seed = [] if "seed" in keys else ["seed"]
    columns = ["run", *first, *keys, *fixed, *seed, "status", "reached", "steps", "wall_s",
               *(f"exact_match {s}" for s in spans)]
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(columns)
    for row in rows:
        values = [row["run"], *(row[k] for k in [*first, *keys, *fixed, *seed]), row["status"],
                  row.get("reached"), row["steps"], row["wall_s"],
                  *(row["exact_match"].get(s) for s in spans)]
        writer.writerow(["null" if v is None else v for v in values])
    write_atomic(folder / "results.csv", table.getvalue().encode("utf-8"))
    plot_results(rows, folder / "results.png")
    write_configurations(folder, configuration_rows(by_configuration(rows), [*keys, *fixed],
                                                    spans))


def range_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Every evaluated range, in the order first met."""
    return list(dict.fromkeys(span for row in rows for span in row["exact_match"]))


def by_configuration(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by their configuration (the swept values but the seed), in order."""
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(row["configuration"], []).append(row)
    return groups


def plot_results(rows: list[dict[str, Any]], path: Path) -> None:
    """results.png: `results_figure`, written by the picture rule (`pictures.save_png`). The sweep
    folder is minitfm's, so its results.png is replaced as the sweep goes (one an older minitfm
    wrote has no mark): as with --force."""
    save_png(results_figure(rows), path, "--out", force=True)


MAX_LINES = 6  # configurations in one panel; more are drawn as small multiples


def results_figure(rows: list[dict[str, Any]]):
    """What differs between the runs: held-out exact match over training steps, a line per run
    styled by configuration (its seeds alike): the gauges' reading every log.gauge_every steps,
    the evaluations as points over it (`plot_run`); below it, when lengths outside the trained ones
    were evaluated (`--eval-lengths`), exact match per input length (mean over seeds). Up to
    MAX_LINES configurations share one column of panels; more get a column per value of the
    swept key with the most values (`small_multiples`), the same style meaning the same values
    of the other keys in every column."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    columns = small_multiples(by_configuration(rows))
    beyond = rows and any(not lo <= int(n) <= hi for row in rows for n in row["per_length"]
                          for lo, hi in [row["trained_lengths"]])
    wide = len(columns) == 1
    fig = Figure(figsize=(8 if wide else 1.5 + 3.2 * len(columns), 4.5 + 3.5 * bool(beyond)),
                 dpi=120, layout="constrained")
    axes = fig.subplots(1 + bool(beyond), len(columns), squeeze=False, sharey=True)
    for c, (title, lines) in enumerate(columns):
        for label, style, group in lines:
            for n, row in enumerate(group):
                plot_run(axes[0][c], Path(row["run_dir"]), style, None if n else label)
        axes[0][c].set(xlabel="step", title=title or "exact match over training (a line per run)")
        if beyond:
            plot_lengths(axes[1][c], rows, lines)
            axes[1][c].set_title(title or "exact match per input length (held-out)")
    axes[0][0].set_ylabel("held-out exact match over training\n(line: gauges, points: "
                          "evaluations)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set(ylim=(-0.02, 1.02), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1])  # none past the limits
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    # one legend beside the panels, not on them: with many configurations it would hide lines
    handles: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize="small", loc="upper left",
                       bbox_to_anchor=(1.01, 1.0))
    return fig


def small_multiples(groups: dict[str, list]) -> list[tuple[str, list]]:
    """[(column title, [(legend label, line style, rows of one configuration)])]: one column
    for up to MAX_LINES configurations, else a column per value of the swept key with the
    most values, each line coloured by the value of the first other key and dashed by the
    second (more other keys: a style per combination, `pictures.line_style`)."""
    values = {label: dict(part.partition("=")[::2] for part in label.split(", "))
              for label in groups}
    keys = list(dict.fromkeys(key for choice in values.values() for key in choice))
    if len(groups) <= MAX_LINES or len(keys) < 2:
        return [("", [(legend_label(label, group), line_style(i), group)
                      for i, (label, group) in enumerate(groups.items())])]
    split = max(keys, key=lambda key: len({choice.get(key) for choice in values.values()}))
    others = [key for key in keys if key != split]
    combos = list(dict.fromkeys(tuple(c.get(k) for k in others) for c in values.values()))
    seen = [list(dict.fromkeys(combo[i] for combo in combos)) for i in range(len(others))]
    columns: dict[str, list] = {}
    for label, group in groups.items():
        combo = tuple(values[label].get(k) for k in others)
        if len(others) > 2:
            style = line_style(combos.index(combo))
        else:
            dash = seen[1].index(combo[1]) if len(others) == 2 else 0
            style = {**line_style(dash * len(LINE_COLOURS)),
                     "color": LINE_COLOURS[seen[0].index(combo[0]) % len(LINE_COLOURS)]}
        legend = short_label(", ".join(f"{k}={v}" for k, v in zip(others, combo, strict=True)))
        title = short_label(f"{split}={values[label].get(split)}")
        columns.setdefault(title, []).append((legend, style, group))
    return list(columns.items())


def legend_label(label: str, group: list[dict[str, Any]]) -> str:
    """A configuration's legend: its swept values (`short_label`: `positional=rope`); in a
    sweep of seeds alone (nothing else swept: the configuration `all`), its seeds."""
    if "=" in label:
        return short_label(label)
    seeds = sorted(row["seed"] for row in group)
    if len(seeds) == 1:
        return f"seed={seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}..{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds[:5])) + (", ..." if len(seeds) > 5 else "")


def exact_curves(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """A run's held-out exact match from its metrics.jsonl: `gauges` (each reading's `exact`,
    teacher-forced on the gauge pairs) and `eval` (each evaluation's `exact_match`, greedy
    decoding), as steps and values (the last record of a step counts, as in
    `curves.run_curves`)."""
    try:
        records = scan_metrics(run_dir)[0]
    except CheckpointError:  # a run whose metrics cannot be read: no line
        records = []
    curves = {}
    for split, key in (("gauges", "exact"), ("eval", "exact_match")):
        by_step = {r["step"]: r[key] for r in records if r["split"] == split}
        steps = sorted(by_step)
        curves[split] = (steps, [by_step[step] for step in steps])
    return curves


def plot_run(ax, run_dir: Path, style: dict[str, Any], label: str | None) -> None:
    """One run's held-out exact match on `ax`: its gauges' readings as a line, its evaluations
    as points over it; without readings (log.gauge_every=0) its evaluations joined, a line
    whose dash may be a swept value's (`small_multiples`). `label` goes on the line."""
    curves = exact_curves(run_dir)
    (gauge_steps, gauges), (eval_steps, evals) = curves["gauges"], curves["eval"]
    if not gauge_steps:
        ax.plot(eval_steps, evals, **style, label=label)
        return
    ax.plot(gauge_steps, gauges, **{**style, "marker": None}, label=label)
    ax.plot(eval_steps, evals, **{**style, "linestyle": "none", "markersize": 5})


def plot_lengths(ax, rows: list[dict[str, Any]], lines: list) -> None:
    """Exact match per input length, a line per configuration (mean over seeds), the trained
    lengths shaded; `lines` as `small_multiples` gives them."""
    for label, style, group in lines:
        lengths = sorted({int(n) for row in group for n in row["per_length"]})
        means = [mean(row["per_length"][n] for row in group if n in row["per_length"])
                 for n in lengths]
        ax.plot(lengths, means, **style, label=label)
    lo, hi = rows[0]["trained_lengths"]
    ax.axvspan(lo - 0.5, hi + 0.5, color="0.93", zorder=0, label=f"trained lengths {lo}..{hi}")
    ax.set_xlabel("input length")
    if ax.get_subplotspec().is_first_col():
        ax.set_ylabel("exact match per input length\n(mean over seeds)")


@dataclass
class SweepResult:
    """What `minitfm sweep` shows at the end."""

    folder: Path
    rows: list[dict[str, Any]]
    keys: list[str]
    failed: list[str]


