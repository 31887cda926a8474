"""Grokking's three phases, memorisation, circuit formation and cleanup (Nanda et al. 2023),
drawn from a modadd run's records: its evaluations and grokking's gauges in its metrics.jsonl
(`grokking.py` reads the gauges as the run trains), as one figure.

`minitfm plot RUN --phases` draws one's own run, beside it; `make figures` draws the docs' own
(docs/grokking.png) from the run it trains. Nothing is trained or loaded here: no torch
(matplotlib is imported inside functions).
"""

from __future__ import annotations

from pathlib import Path

from minitfm.errors import CheckpointError, MinitfmError, quote
from minitfm.lab.curves import is_number, read_metrics
from minitfm.lab.pictures import check_output, line_style, points_or_line, save_png
from minitfm.run.summary import read_run_config

KEY_FREQUENCIES = 5  # the gauges' key frequencies: as many as Nanda et al.'s model (p = 113) used
GAUGES = ("train_exact", "restricted_loss", "excluded_loss", "fourier_sparsity")
DRAWN = (*GAUGES, "weight_norm")  # and the norm of the weight matrices, every run's gauge
PHASES_NAME = "phases.png"  # what `plot --phases` writes in the run directory


def read_phases(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """A run's curves from its metrics.jsonl (`curves.read_metrics`: records only):
    `held_out` (exact match at each evaluation) and each gauge of its `gauges` lines, as
    (step, value) in order of step (a resumed run's later line wins)."""
    curves: dict[str, dict[int, float]] = {name: {} for name in ("held_out", *DRAWN)}
    for record in read_metrics(Path(run_dir)):
        names = {"eval": {"exact_match": "held_out"},
                 "gauges": {name: name for name in DRAWN}}.get(record["split"], {})
        for key, name in names.items():
            if is_number(record.get(key)):
                curves[name][record["step"]] = float(record[key])
    return {name: sorted(points.items()) for name, points in curves.items()}


def check_phases(run_dir: Path, curves: dict[str, list[tuple[int, float]]]) -> None:
    """A MinitfmError naming what the run is, unless its metrics.jsonl holds grokking's gauges
    (a modadd run's, read every log.gauge_every steps)."""
    if any(curves[name] for name in GAUGES):
        return
    try:
        task = ((read_run_config(run_dir) or {}).get("task") or {}).get("name")
    except CheckpointError:  # a damaged config.yaml: the gauges are what is missing
        task = None
    if isinstance(task, str) and task != "modadd":
        raise MinitfmError(f"run '{run_dir}' learns {quote(task)}: --phases draws grokking's "
                           f"phases, from the gauges only a modadd run has (minitfm train "
                           f"configs/grokking.yaml); minitfm plot --metric KEY draws any number")
    raise MinitfmError(f"run '{run_dir}' has no grokking gauges in its metrics.jsonl yet: a "
                       f"modadd run writes them every log.gauge_every steps (never with 0): train "
                       f"it with log.gauge_every=20, as configs/grokking.yaml does, or wait for "
                       f"its first reading")


def phase_steps(curves: dict[str, list[tuple[int, float]]], level: float = 0.99) -> dict:
    """Where the phases end: memorisation at the first gauge line with train_exact >= `level`,
    circuit formation at the last evaluation before held-out exact match first reaches half
    of `level` (the jump begins), cleanup at the first evaluation with held-out exact match
    >= `level` (None: not reached)."""
    def first(points, test):
        return next((step for step, value in points if test(value)), None)

    memorised = first(curves["train_exact"], lambda v: v >= level)
    halfway = first(curves["held_out"], lambda v: v >= level / 2)
    before = [step for step, _ in curves["held_out"] if halfway is not None and step < halfway]
    return {"memorised": memorised, "jump_begins": before[-1] if before else halfway,
            "grokked": first(curves["held_out"], lambda v: v >= level)}


def describe_phases(steps: dict) -> str:
    """`memorised by step 60, held-out 99% at step 5020`, or what the run has not reached yet
    (`steps` as `phase_steps` gives them)."""
    if steps["memorised"] is None:
        return "not memorised yet (training exact match under 99%)"
    grokked = (f"held-out 99% at step {steps['grokked']}" if steps["grokked"] is not None
               else "held-out exact match not yet at 99%")
    return f"memorised by step {steps['memorised']}, {grokked}"


def last_step(curves: dict[str, list[tuple[int, float]]]) -> int:
    """The latest step of any curve (0: none)."""
    return max((step for points in curves.values() for step, _ in points), default=0)


def phases_figure(curves: dict[str, list[tuple[int, float]]], title: str):
    """Four panels over steps, the phases shaded: exact match (training pairs, held-out
    pairs: points where there are few evaluations), restricted and excluded loss (log scale),
    Fourier sparsity, weight norm."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(11, 10), dpi=100, layout="constrained")
    exact_ax, loss_ax, sparse_ax, norm_ax = fig.subplots(4, 1, sharex=True)
    lines = [(exact_ax, "train_exact", "training pairs"), (exact_ax, "held_out", "held-out pairs"),
             (loss_ax, "restricted_loss", "restricted loss (key frequencies only, all pairs)"),
             (loss_ax, "excluded_loss", "excluded loss (key frequencies removed, training "
              "pairs)"),
             (sparse_ax, "fourier_sparsity", f"embedding's energy in its {KEY_FREQUENCIES} "
              f"strongest frequencies"),
             (norm_ax, "weight_norm", "L2 norm of the weight matrices")]
    for i, (ax, name, label) in enumerate(lines):
        steps, values = zip(*curves[name]) if curves[name] else ((), ())
        style = line_style(i % 2 if i < 4 else 0)
        ax.plot(steps, values, label=label,
                **(points_or_line(style, len(steps)) if name == "held_out" else style))
    shade_phases(fig.axes, phase_steps(curves), last_step(curves))
    exact_ax.set(ylabel="exact match", ylim=(-0.02, 1.02), title=title)
    exact_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    loss_ax.set(ylabel="loss per answer", yscale="log")
    sparse_ax.set(ylabel="Fourier sparsity", ylim=(0, 1.02))
    norm_ax.set(ylabel="weight norm", xlabel="step")
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        # beside the axes, not on them: the curves fill the width
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def shade_phases(axes, steps: dict, last: int) -> None:
    """Memorisation, circuit formation and cleanup shaded on each of `axes`, named on the
    first."""
    edges = [0, steps["memorised"], steps["jump_begins"], steps["grokked"] or last]
    if None in edges:
        return  # a run that never memorised or never jumped has no three phases to shade
    names = ("memorisation", "circuit formation", "cleanup")
    for i, name in enumerate(names):
        for ax in axes:
            ax.axvspan(edges[i], edges[i + 1], color=("#fde0c5", "#e8e8e8", "#d4ecd9")[i],
                       alpha=0.6, linewidth=0)
        narrow = edges[i + 1] - edges[i] < 0.15 * last  # a name across it would not fit
        axes[0].text((edges[i] + edges[i + 1]) / 2, 0.6, name, ha="center", va="center",
                     rotation=90 if narrow else 0, fontsize="small", color="#444444")


def draw_phases(run_dir: str | Path, out: str | Path, force: bool = True) -> dict:
    """The figure of a modadd run's three phases as a PNG (the picture rule, checked before
    anything is read); the steps that end them, and the gauges there. A run without grokking's
    gauges is a MinitfmError (`check_phases`)."""
    run_dir, out = Path(run_dir), Path(out)
    check_output(out, "--out", force)
    curves = read_phases(run_dir)
    check_phases(run_dir, curves)
    steps = phase_steps(curves)
    title = f"grokking a + b mod p: {describe_phases(steps)}"
    save_png(phases_figure(curves, title), out, "--out", force)
    at = {name: dict(points) for name, points in curves.items()}
    return {"phases": steps,
            "gauges": {phase: {name: round(at[name][step], 4) for name in DRAWN
                               if step in at[name]}
                       for phase, step in steps.items() if step is not None}}
