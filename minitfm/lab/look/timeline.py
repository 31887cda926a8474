"""Attention over training: at each of `log.attention_every`'s steps (by default at every
evaluation) a snapshot of the probe's cross-attention and of every cross-attention head's
scores, recorded to `attention.jsonl`; `visualize-attention --over-training` draws them as one
PNG strip (columns steps, rows the heads of one layer) and, with `--gif`, an animated GIF.

`attention.jsonl` holds one JSON object per snapshot (a resumed run appends; the last record of
a step counts):

- `step`, and `exact_match` of the evaluation at that step (null when none fell on it);
- `input`, `target`: the probe, the fixed held-out example TensorBoard shows; `source` and
  `decoder_input` (`<bos>` + the target): the tokens on the maps' axes;
- `alignment`: (L, H) each cross-attention head's alignment score (see `viz`) on 200 held-out
  pairs, null for tasks without an ideal alignment; `entropy`: (L, H) its attention entropy on
  the same pairs, in nats: for each query row (the rows that write a target token or EOS) the
  entropy -sum_j a_j ln a_j of its weights over the source, averaged over the rows. Uniform
  attention over S keys gives ln S, a head that looks at a single key gives 0;
- `cross`: (L, H, T_q, T_k) the probe's cross-attention, teacher-forced on its target (the same
  axes at every step), weights rounded to 3 decimals (about 11 kB a line for the default run).

Shapes: N snapshots, L layers, H n_heads, T_q and T_k query and key len.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from minitfm.errors import CheckpointError, MinitfmError, quote
from minitfm.lab.plots import SOFTWARE, check_output, write_picture
from minitfm.lab.probe import ALIGNMENT_SAMPLES, Probe, head_scores, pick_probe, run_probe
from minitfm.run.instruments import Evaluation, Instrument, SnapshotDue, Started
from minitfm.tasks.base import BOS_ID, EOS_ID, Pair, Task

ATTENTION_FILE = "attention.jsonl"
MAP_DECIMALS, SCORE_DECIMALS = 3, 4
MAX_COLUMNS = 12  # a strip of more recorded steps shows this many, evenly spread
GIF_FRAME_MS, GIF_LAST_MS = 700, 2500  # the last frame, the trained model, stays longer
HOW_TO_RECORD = ("train a run with the defaults log.attention_record=true and "
                 "log.attention_every=eval (e.g. minitfm train)")


# --- recording, during training ---

@dataclass
class Snapshot:
    """The attention of one step: the probe (maps teacher-forced on its target) and each
    cross-attention head's alignment score and entropy, (L, H) each."""

    step: int
    probe: Probe
    target: list[int]
    alignment: Tensor | None  # None: the task has no ideal alignment
    entropy: Tensor
    exact_match: float | None  # of the evaluation at this step, if one fell on it

    def record(self, task: Task) -> dict:
        """The line of attention.jsonl (see the module docstring)."""
        token = task.vocab.token
        cross = torch.stack(self.probe.maps.cross).numpy()  # (L, H, T_q, T_k)
        alignment = None if self.alignment is None else rounded(self.alignment, SCORE_DECIMALS)
        return {"step": self.step, "exact_match": self.exact_match,
                "input": task.format(self.probe.src), "target": task.format(self.target),
                "source": [token(i) for i in self.probe.src],
                "decoder_input": [token(i) for i in self.probe.decoder_input],
                "alignment": alignment, "entropy": rounded(self.entropy, SCORE_DECIMALS),
                "cross": rounded(cross, MAP_DECIMALS)}


def rounded(values, decimals: int) -> list:
    """Nested lists of `values` rounded to `decimals` (float64 first: 0.123, not 0.12300000339)."""
    return np.round(np.asarray(values, dtype=np.float64), decimals).tolist()


class AttentionRecorder(Instrument):
    """Takes the attention snapshots of a run and appends them to attention.jsonl (`path`;
    None: not recorded, the snapshots go to TensorBoard only). Inactive (until a run's start
    aims it, or when nothing wants them), it takes none. An instrument (see
    `run.instruments`): the run says when a snapshot is due."""

    def __init__(self, task: Task | None = None, eval_pairs: list[Pair] = (),
                 path: Path | None = None, active: bool = False, recorded: Pair | None = None):
        self.aim(task, eval_pairs, path, active, recorded)

    def aim(self, task: Task | None, eval_pairs: list[Pair], path: Path | None, active: bool,
            recorded: Pair | None = None) -> None:
        """Look at `task`'s attention on a probe from `eval_pairs`, recording to `path`."""
        self.task, self.path = task, path
        # The same probe at every step, so the maps show how one example's attention evolves:
        # on resume the one already `recorded` (train.eval_samples may have changed), else
        # picked from the held-out set. An equal held-out pair is used itself, so that an
        # evaluation's output for it is found.
        probe = recorded or (pick_probe(eval_pairs) if eval_pairs else None)
        self.probe = next((pair for pair in eval_pairs if pair == probe), probe) if active \
            else None
        self.pairs = eval_pairs[:ALIGNMENT_SAMPLES]
        self.taken: Snapshot | None = None
        self.evaluation: tuple[int, list[int] | None, float] | None = None

    def on_start(self, run: Started) -> None:
        """Aim at the run: active when TensorBoard or attention.jsonl wants snapshots; a
        resumed run goes on with the probe its attention.jsonl holds."""
        cfg, path = run.cfg, run.run_dir / ATTENTION_FILE
        active = cfg.log.tensorboard or cfg.log.attention_record
        recorded = recorded_probe(path, run.task) if active else None
        self.aim(run.task, run.eval_pairs, path if cfg.log.attention_record else None, active,
                 recorded)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        """Its exact match, and the probe's output if it decoded it (the snapshot at this step
        then decodes nothing)."""
        output = next((prediction for pair, prediction in
                       zip(evaluation.pairs, evaluation.predictions, strict=True)
                       if pair is self.probe), None)
        self.evaluation = evaluation.step, output, evaluation.exact_match

    def on_snapshot(self, due: SnapshotDue) -> None:
        """The snapshot of this step, to attention.jsonl."""
        snapshot = self.take(due.step, due.model)
        if snapshot is not None:
            self.write(snapshot)

    def take(self, step: int, model) -> Snapshot | None:
        """The snapshot of `model` at `step`, taken once per step (TensorBoard draws the one
        recorded); None when inactive."""
        if self.probe is None:
            return None
        if self.taken is not None and self.taken.step == step:
            return self.taken
        _, output, exact_match = self.evaluation if self.evaluation and \
            self.evaluation[0] == step else (step, None, None)
        src, target = self.probe
        probe = run_probe(model, self.task, src, teacher=target, output=output)
        scores = head_scores(model, self.task, self.pairs)
        self.taken = Snapshot(step, probe, target, scores.soft, scores.entropy, exact_match)
        return self.taken

    def write(self, snapshot: Snapshot) -> None:
        """Append the snapshot's line to attention.jsonl (when recording)."""
        if self.path is None:
            return
        line = json.dumps(snapshot.record(self.task), separators=(",", ":"))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def recorded_probe(path: Path, task: Task) -> Pair | None:
    """The probe of the last whole record of `path` (None: no file, no record, or one this
    task cannot read), as (source ids, target ids)."""
    last = None
    try:
        if not path.is_file():  # a FIFO would block
            return None
        with open(path, encoding="utf-8") as f:
            for line in f:
                last = line if line.endswith("\n") else last  # a torn last line has no \n
        record = json.loads(last or "null")
        source, decoder_input = record["source"], record["decoder_input"]
        if not isinstance(source, list) or not isinstance(decoder_input, list):
            return None
        special = task.vocab.tokens[:EOS_ID + 1]  # PAD, BOS, EOS never sit inside a pair
        if not source or decoder_input[:1] != [task.vocab.token(BOS_ID)] or any(
                token in special for token in [*source, *decoder_input[1:]]):
            return None
        return [task.vocab.id(t) for t in source], [task.vocab.id(t) for t in decoder_input[1:]]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, TypeError, KeyError,
            MinitfmError):  # not what minitfm writes: a new probe, as for a fresh run
        return None


# --- reading ---

@dataclass
class Timeline:
    """A run's recorded snapshots in step order: scores (N, L, H), maps (N, L, H, T_q, T_k)."""

    run_dir: Path
    steps: list[int]
    exact_match: list[float | None]
    input: str
    target: str
    source: list[str]
    decoder_input: list[str]
    alignment: np.ndarray | None  # None: the task has no ideal alignment
    entropy: np.ndarray
    cross: np.ndarray


def read_timeline(run_dir: Path) -> Timeline:
    """The snapshots of attention.jsonl; a run without any is a one-line error saying how to
    get them. A torn last line (a killed run) is skipped."""
    path = run_dir / ATTENTION_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"cannot read '{path}' ({err}): {HOW_TO_RECORD}") from None
    records = {}
    for line in lines:
        try:
            record = json.loads(line)
            records[record["step"]] = record  # a resumed run's later record wins
        except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: "[[[[..."
            continue
    if not records and any(line.strip() for line in lines):
        raise CheckpointError(f"'{path}' holds no record minitfm writes: {HOW_TO_RECORD}")
    if not records:
        raise CheckpointError(f"run '{run_dir}' has no recorded attention (no {ATTENTION_FILE}: "
                              f"trained before minitfm recorded it, or with recording off): "
                              f"{HOW_TO_RECORD}")
    try:
        return timeline_of(run_dir, [records[step] for step in sorted(records)])
    except (ValueError, TypeError, KeyError) as err:
        raise CheckpointError(f"'{path}' holds records minitfm did not write ({err!r}): "
                              f"{HOW_TO_RECORD}") from None


def timeline_of(run_dir: Path, records: list[dict]) -> Timeline:
    """The records' arrays, checked for types and shape (one probe, one model)."""
    for record in records:
        check_types(record)
    last = records[-1]
    cross = np.array([r["cross"] for r in records], dtype=np.float32)  # (N, L, H, T_q, T_k)
    entropy = np.array([r["entropy"] for r in records], dtype=np.float64)  # (N, L, H)
    aligned = all(r["alignment"] is not None for r in records)
    alignment = np.array([r["alignment"] for r in records], dtype=np.float64) if aligned \
        else None
    shape = (len(records), *cross.shape[1:3])
    if cross.ndim != 5 or entropy.shape != shape or (aligned and alignment.shape != shape):
        raise ValueError(f"maps {cross.shape}, entropy {entropy.shape}")
    if cross.shape[3:] != (len(last["decoder_input"]), len(last["source"])):
        raise ValueError(f"maps {cross.shape[3:]} for the probe's tokens")
    return Timeline(run_dir, [r["step"] for r in records],
                    [r["exact_match"] for r in records], last["input"], last["target"],
                    last["source"], last["decoder_input"], alignment, entropy, cross)


def check_types(record: dict) -> None:
    """A record's scalars and tokens have the types minitfm writes (a ValueError if not): a
    hand-edited `"exact_match": "high"` would otherwise fail only when drawn."""
    step, exact_match = record["step"], record["exact_match"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step {quote(step)} is not an integer")
    if exact_match is not None and (isinstance(exact_match, bool)
                                    or not isinstance(exact_match, (int, float))):
        raise ValueError(f"exact_match {quote(exact_match)} of step {step} is not a number "
                         f"or null")
    for key in ("input", "target"):
        if not isinstance(record[key], str):
            raise ValueError(f"{key} of step {step} is not text")
    for key in ("source", "decoder_input"):
        if not isinstance(record[key], list) or not all(isinstance(t, str) for t in record[key]):
            raise ValueError(f"{key} of step {step} is not a list of tokens")


# --- `minitfm visualize-attention --over-training` ---

@dataclass
class OverTrainingReport:
    """What `--over-training` shows: the timeline, the layer drawn (and why), the files."""

    timeline: Timeline
    layer: int
    why: str
    png: Path
    gif: Path | None
    note: str | None = None  # symbols the strip labels by code point (`viz.Lettering.note`)


def over_training(run: Path | None, layer: int | None = None, out: Path | None = None,
                  gif: Path | None = None, force: bool = False) -> OverTrainingReport:
    """Draw a run's recorded cross-attention as one PNG strip (and, with `gif`, a GIF). An
    existing file is replaced if minitfm wrote it, or with `force` (`plots.check_output`)."""
    from minitfm.lab.plots import save_png
    from minitfm.lab.viz import lettering
    from minitfm.run.rundir import run_directory

    run_dir = run_directory(run, "--over-training reads the run's attention.jsonl")
    timeline = read_timeline(run_dir)
    layer, why = pick_layer(timeline, layer)
    png = out if out is not None else run_dir / "attention" / f"over-training-layer{layer}.png"
    check_output(png, "--out", force)
    if gif is not None:
        check_gif(gif, force)  # both, before anything is drawn
    title = strip_title(timeline, why, shown_columns(len(timeline.steps)))
    letters = lettering([title, *timeline.source, *timeline.decoder_input])
    with letters.fonts():
        save_png(strip_figure(timeline, layer, why, letters), png, "--out", force)
    if gif is not None:
        write_gif(timeline, gif, force)
    return OverTrainingReport(timeline, layer, why, png, gif, letters.note())


def pick_layer(timeline: Timeline, layer: int | None) -> tuple[int, str]:
    """The layer to draw and why: `layer`, else the one whose best head has the highest final
    alignment score, else (no ideal alignment) the last."""
    n_layers = timeline.cross.shape[1]
    if layer is not None:
        if not 0 <= layer < n_layers:
            raise MinitfmError(f"--layer ({layer}) must be in 0..{n_layers - 1}: the model has "
                               f"{n_layers} decoder layers")
        return layer, f"layer {layer} (--layer)"
    if timeline.alignment is None:
        return n_layers - 1, f"layer {n_layers - 1}, the last: the task has no ideal alignment"
    final = timeline.alignment[-1]  # (L, H)
    best = int(final.max(axis=1).argmax())
    head = int(final[best].argmax())
    return best, (f"layer {best}, where head {head} has the best final alignment score, "
                  f"{final[best, head]:.2f}")


def shown_columns(n: int) -> list[int]:
    """The snapshots a strip shows: all, or MAX_COLUMNS spread evenly, first and last kept."""
    return sorted({round(i) for i in np.linspace(0, n - 1, min(n, MAX_COLUMNS))})


def exact_match_text(value: float | None) -> str:
    return "no evaluation" if value is None else f"exact match {value:.1%}"


def head_text(timeline: Timeline, n: int, layer: int, head: int, labelled: bool = True) -> str:
    """A head's scores at snapshot `n`: alignment (if any) and entropy."""
    align, h = ("align ", "H ") if labelled else ("", "")
    entropy = f"{h}{timeline.entropy[n, layer, head]:.2f}"
    if timeline.alignment is None:
        return entropy
    return f"{align}{timeline.alignment[n, layer, head]:.2f} · {entropy}"


def strip_title(timeline: Timeline, why: str, columns: list[int]) -> str:
    """Task, run, layer and why; the probe; how to read the numbers."""
    shown = "" if len(columns) == len(timeline.steps) else \
        f" ({len(columns)} of {len(timeline.steps)} recorded steps; the GIF has all)"
    align = "align = alignment score, " if timeline.alignment is not None else ""
    return (f"{run_title(timeline)} · cross-attention over training{shown}\n"
            f"rows: the heads of {why}\n"
            f"probe: input {timeline.input} → target {timeline.target} (teacher-forced on the "
            f"target; colour ∝ √weight)\n{align}H = attention entropy in nats, on "
            f"{ALIGNMENT_SAMPLES} held-out pairs")


def run_title(timeline: Timeline) -> str:
    """The task's name and the run's."""
    from minitfm.lab.plots import read_config

    try:
        task = read_config(timeline.run_dir).get("task", {}).get("name", "?")
    except CheckpointError:  # a damaged config.yaml: the title does without the task
        task = "?"
    return f"{task} · {timeline.run_dir.name}"


def strip_figure(timeline: Timeline, layer: int, why: str, letters=None):
    """A matplotlib Figure: a column per recorded step (step and exact match on top), a row per
    head of `layer`, source tokens under every map and decoder input left of each row, axis
    titles, one colour bar; symbols as `letters` (a `viz.Lettering`) writes them."""
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    from minitfm.lab.plots import wrap_to_width
    from minitfm.lab.viz import (
        COLOUR_BAR_LABEL,
        GAMMA,
        HEAD_SIZE,
        TITLE_MARGIN,
        TITLE_SIZES,
        Lettering,
        text_height,
    )

    letters = letters or Lettering()
    columns, n_heads = shown_columns(len(timeline.steps)), timeline.cross.shape[2]
    tokens = max(len(timeline.source), len(timeline.decoder_input))
    # inches: room for a label per token at TICK_SIZE points, and for the scores
    panel = max(1.8, 0.6 + 0.14 * tokens)
    width = len(columns) * panel + 1.5
    title = wrap_to_width(letters.text(strip_title(timeline, why, columns)),
                          width - TITLE_MARGIN, TITLE_SIZES[0])
    fig = Figure(figsize=(width, n_heads * (panel + 0.6) + 0.8 + text_height(title, 11)),
                 dpi=100, layout="constrained")
    fig.suptitle(title, fontsize=TITLE_SIZES[0])
    axes = fig.subplots(n_heads, len(columns), squeeze=False)
    norm = PowerNorm(GAMMA, vmin=0.0, vmax=1.0)  # one scale for every step and head
    for c, n in enumerate(columns):
        for head in range(n_heads):
            ax = axes[head, c]
            image = ax.imshow(timeline.cross[n, layer, head], cmap="viridis", norm=norm,
                              aspect="auto")
            scores = head_text(timeline, n, layer, head)
            top = f"step {timeline.steps[n]}\n{exact_match_text(timeline.exact_match[n])}\n"
            ax.set_title((top if head == 0 else "") + scores, fontsize=HEAD_SIZE)
            # source tokens under every map: each row of heads is read on its own
            label_axes(ax, timeline, bottom=True, left=c == 0, letters=letters)
            if c == 0:
                ax.set_ylabel(f"head {head}\nquery: decoder input", fontsize=HEAD_SIZE)
    fig.supxlabel(wrap_to_width("key: source token (the same input at every step)",
                                width - TITLE_MARGIN, HEAD_SIZE + 1), fontsize=HEAD_SIZE + 1)
    fig.colorbar(image, ax=axes, shrink=0.9, label=COLOUR_BAR_LABEL, pad=0.01)
    return fig


def label_axes(ax, timeline: Timeline, bottom: bool, left: bool, letters=None) -> None:
    """The probe's tokens: source under the map if `bottom`, decoder input left of it if `left`."""
    from minitfm.lab.viz import Lettering, MapBlock, label_tokens

    axes = MapBlock("cross", [], [], np.empty(0), timeline.decoder_input, timeline.source)
    label_tokens(ax, (letters or Lettering()).block(axes), bottom, left)


def check_gif(path: Path, force: bool = False) -> None:
    """--gif must name a .gif file (not a directory) that may be written (the picture rule)."""
    check_output(path, "--gif", force, ".gif")


def write_gif(timeline: Timeline, path: Path, force: bool = False) -> None:
    """An animated GIF, a frame per recorded step: every layer and head of cross-attention
    (TensorBoard's picture), captioned with the step, its exact match and the best alignment.
    Written atomically, as the PNGs, and marked as minitfm's by its comment."""
    from PIL import Image

    from minitfm.lab.viz import KIND_TITLES, MapBlock, MapGrid

    n_layers, n_heads = timeline.cross.shape[1:3]
    block = MapBlock("cross", list(range(n_layers)), list(range(n_heads)), timeline.cross[0],
                     timeline.decoder_input, timeline.source)
    captions = [gif_caption(timeline, n) for n in range(len(timeline.steps))]
    header = (f"{run_title(timeline)} · {KIND_TITLES['cross']}\ninput {timeline.input} → "
              f"target {timeline.target} (teacher-forced on the target; colour ∝ √weight; "
              f"^ = <bos>)")
    grid = MapGrid(block, header, max(captions, key=len))
    frames = [Image.fromarray(grid.frame(replace(block, weights=timeline.cross[n]), caption))
              for n, caption in enumerate(captions)]
    durations = [GIF_FRAME_MS] * (len(frames) - 1) + [GIF_LAST_MS]
    check_gif(path, force)
    write_picture(path, "--gif", lambda buffer: frames[0].save(
        buffer, format="GIF", save_all=True, append_images=frames[1:], duration=durations,
        loop=0, comment=SOFTWARE))


def gif_caption(timeline: Timeline, n: int) -> str:
    best = "" if timeline.alignment is None else \
        f" · best alignment {timeline.alignment[n].max():.2f}"
    return f"step {timeline.steps[n]} · {exact_match_text(timeline.exact_match[n])}{best}"
