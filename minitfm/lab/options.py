"""The options of the lab's commands, one dataclass per command: those that look at a trained
run, the sweep, and the runs.

Each field states its option once: the default, the bounds (`low`..`high`, for numbers) and the
help text. The command line builds its Typer options from them (`app/parameters.py`, `option`),
the Python API checks its arguments against the same bounds (`app/api.py`), and the lab
functions take the object whole: `eval_report(loaded, EvalOptions(max_len=32))`. RUN and
--checkpoint are not options of a command but of the loading (`lab/loaded.py`); a sweep's
config and grid are its arguments.

No torch here, and nothing slow to import: `minitfm --help` reads this module.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from minitfm.config import EVAL_BATCH_SIZE, SEED_RANGE
from minitfm.errors import ConfigError, MinitfmError, quote

MAX_SAMPLES = 100_000  # held-out sequences a command decodes, and sequences decoded at once
MAX_LEN = 65_536  # input lengths a command may ask for (task.max_len's own bound)
MODES = ("zero", "mean")  # what a switched-off head outputs (lab/interpret/ablate.py)
BATCH_HELP = "Sequences decoded at once; lower it to save memory."


def option(default: Any, help_text: str, low: int | None = None, high: int | None = None,
           **cli: Any) -> Any:
    """A field that is one option: its default, help text and bounds; `cli` holds how the
    command line spells it when its name does not say it (`flags`, `metavar`)."""
    return field(default=default, metadata={"help": help_text, "low": low, "high": high,
                                            "cli": cli})


def option_field(options: type, name: str) -> Field:
    """The field `name` of an options class (a KeyError for a name it has not)."""
    return {spec.name: spec for spec in fields(options)}[name]


def bounded(options: object) -> list[tuple[str, Any, int, int]]:
    """(name, value, low, high) of each option with bounds that is set (an optional option left
    at None is not checked)."""
    return [(spec.name, getattr(options, spec.name), spec.metadata["low"], spec.metadata["high"])
            for spec in fields(options) if spec.metadata["low"] is not None
            and not (spec.default is None and getattr(options, spec.name) is None)]


@dataclass(frozen=True)
class EvalOptions:
    """`minitfm eval` and `Run.evaluate`: which held-out sequences, decoded how many at once."""

    samples: int = option(1000, "Held-out sequences to decode.", 1, MAX_SAMPLES)
    min_len: int | None = option(None, "Shortest input length (default: the trained "
                                 "task.min_len).", 1, MAX_LEN)
    max_len: int | None = option(None, "Longest input length; may go beyond the trained range "
                                 "(default: task.max_len).", 1, MAX_LEN)
    seed: int | None = option(None, "Seed of the held-out set (default: task.eval_seed).",
                              SEED_RANGE["ge"], SEED_RANGE["le"])
    batch_size: int = option(EVAL_BATCH_SIZE, BATCH_HELP, 1, MAX_SAMPLES)


@dataclass(frozen=True)
class AblateOptions:
    """`minitfm ablate`: what a switched-off head outputs, on how many held-out sequences, and
    where the picture goes."""

    mode: str = option("zero", "zero: a switched-off head outputs 0 (before W^O); mean: its "
                       "mean output over the held-out set.", metavar="|".join(MODES))
    samples: int = option(500, "Held-out sequences to decode per ablation.", 1, MAX_SAMPLES)
    batch_size: int = option(EVAL_BATCH_SIZE, BATCH_HELP, 1, MAX_SAMPLES)
    out: Path | None = option(None, "PNG path (default: a file in <run>/ablate/ named after the "
                              "checkpoint, step and mode; for a .pt outside any run, a file "
                              "beside it).", metavar="FILE")
    force: bool = option(False, "Replace --out even if it is not a picture minitfm wrote.",
                         flags=("--force",))


@dataclass(frozen=True)
class ExplainOptions:
    """`minitfm explain`: on how many held-out sequences, and where the role cards go."""

    samples: int = option(1000, "Held-out sequences to decode per head switched off.", 1,
                          MAX_SAMPLES)
    out: Path | None = option(None, "Folder for the role cards' PNG and its JSON, named "
                              "<checkpoint>-step<N>.png as in the default folder, "
                              "<run>/explain/ (for a .pt outside any run, a file beside it).",
                              metavar="DIR")
    force: bool = option(False, "Replace the PNG even if it is not a picture minitfm wrote.",
                         flags=("--force",))


@dataclass(frozen=True)
class PatchOptions:
    """`minitfm patch`: the clean and the corrupted input, and where the heatmap goes."""

    clean: str | None = option(None, "The clean input in task syntax (default: the held-out "
                               "example TensorBoard shows).", metavar="TEXT")
    corrupt: str | None = option(None, "The corrupted input, as long as the clean one "
                                 "(default: the first one-token change of it that changes "
                                 "the answer).", metavar="TEXT")
    out: Path | None = option(None, "PNG path (default: a file in <run>/patch/ named after the "
                              "checkpoint, step and the pair of inputs, 8 hex digits of their "
                              "digest: each pair its own file; for a .pt outside any run, a "
                              "file beside it).", metavar="FILE")
    force: bool = option(False, "Replace --out even if it is not a picture minitfm wrote.",
                         flags=("--force",))


@dataclass(frozen=True)
class VisualizeOptions:
    """`minitfm visualize-attention`: which input, which maps, where the picture goes."""

    input_text: str | None = option(None, "Input in task syntax (default: the held-out example "
                                    "TensorBoard shows).", flags=("--input",), metavar="TEXT")
    kind: str = option("all", "Which maps: encoder, decoder, cross or all.", metavar="KIND")
    layer: int | None = option(None, "Only this layer (from 0); with --over-training, the layer "
                               "whose heads are drawn.")
    head: int | None = option(None, "Only this head (from 0).")
    out: Path | None = option(None, "PNG path (default: a file in <run>/attention/ named after "
                              "the checkpoint and step, or over-training-layer<L>.png; for a "
                              ".pt outside any run, a file beside it).")
    force: bool = option(False, "Replace the --out (and --gif) file even if it is not a "
                         "picture minitfm wrote.", flags=("--force",))


@dataclass(frozen=True)
class SweepOptions:
    """`minitfm sweep`: how many runs at once, what each evaluates, where the sweep folder is."""

    seeds: str | None = option(None, "Seeds to sweep: seeds and ranges A..B, e.g. 0..7 or "
                               "0,1,2 (= seed=0,1,2); the table gives each configuration's "
                               "95% intervals over them.", metavar="A..B,N,...")
    jobs: int | None = option(None, "Runs at once (default: as many as the cores hold at one "
                              "thread each); each is a process of its own, ~300 MB with torch "
                              "plus its run.", 1)
    threads: int | None = option(None, "Threads per job (default: 1, or cores // --jobs); jobs "
                                 "x threads may not exceed the cores.", 1)
    eval_lengths: list[str] | None = option(None, "Also evaluate on these input lengths "
                                            "(repeatable); the trained range always is.",
                                            flags=("--eval-lengths",), metavar="A..B")
    eval_samples: int = option(1000, "Held-out sequences per evaluation.", 1, MAX_SAMPLES)
    name: str | None = option(None, "Sweep name (default: the config's file name, other "
                              "characters than letters, digits, '_', '-', '.' as '_').",
                              metavar="NAME")
    out: Path | None = option(None, "Sweep folder: a new or empty one, or this sweep's own "
                              "(default: a new one in log.dir named sweep-NAME-DIFF-TIME, "
                              "DIFF what the grid changes in the config, e.g. lr0.005, "
                              "or the one that holds this same grid and base config).")
    on: str = option("local", "Where the jobs run: local (processes of this machine) or ray "
                     "(tasks on a Ray cluster: --ray-address, else $RAY_ADDRESS, else a Ray "
                     "started on this machine; pip install 'minitfm[ray]').", metavar="local|ray")
    ray_address: str | None = option(None, "The Ray cluster's address, HOST:PORT (with --on "
                                     "ray).", metavar="ADDR")
    stack: bool | None = option(None, "Train the runs that share a model shape as one stacked "
                                "model a job (--stack), or each run alone (--no-stack); default: "
                                "stacked where it pays, on a GPU.", flags=("--stack/--no-stack",))
    skip_invalid: bool = option(False, "Leave out the combinations that fail validation instead "
                                "of refusing the grid (e.g. positional none beside a number of "
                                "random positions).", flags=("--skip-invalid",))
    trials: int | None = option(None, "A search's trials (a sweep with a range such as "
                                "KEY=interval(A,B)): configurations drawn by Optuna, each run "
                                "with every seed (default: 20; more continues a search).",
                                1, 10_000)
    sampler: str = option("tpe", "How a search draws its trials: tpe (Optuna's default), random, "
                          "or grid (every value of ranges and choices).", metavar="tpe|random|grid")
    sampler_seed: int = option(0, "The seed of a search's sampler: the same seed draws the same "
                               "trials.", 0, 2**31 - 1)
    prune: str = option("none", "Stop a search's hopeless trials: none, median (below the "
                        "median of complete trials at a reading), or forecast (minitfm's "
                        "forecast says short of the target).", metavar="none|median|forecast")


@dataclass(frozen=True)
class RunsOptions:
    """`minitfm runs`: which runs, and gathered by which keys."""

    where: list[str] | None = option(None, "Only the runs whose KEY has this value, compared as "
                                     "typed values (train.lr=5e-3 is train.lr=0.005); any config "
                                     "key, summary.KEY, gauges.KEY, status, exact_match... "
                                     "(repeatable: all must hold).", flags=("--where",),
                                     metavar="KEY=VALUE")
    group_by: list[str] | None = option(None, "A row per value of KEY (repeatable: per "
                                        "combination): n, held-out exact match, runs at target "
                                        "and steps, each with its 95% interval.",
                                        flags=("--group-by",), metavar="KEY")


def stack_sizes(text: str | None) -> list[int]:
    """`--stacks 1,16,64`: the stack sizes, each 1 to 4096."""
    if text is None:
        return []
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or not all(1 <= n <= 4096 for n in sizes):
        raise MinitfmError(f"--stacks ({text!r}) must be stack sizes from 1 to 4096, "
                           f"comma-separated, e.g. 1,16,64,256")
    return sizes


def seeds_once(seeds: list[str] | None) -> str | None:
    """`--seeds` as given once (Click would keep the last of several alone: refused)."""
    if seeds and len(seeds) > 1:
        raise ConfigError(f"--seeds is given {len(seeds)} times "
                          f"({', '.join(map(quote, seeds))}): give every seed in one, e.g. "
                          f"--seeds {','.join(seeds)}")
    return seeds[0] if seeds else None
