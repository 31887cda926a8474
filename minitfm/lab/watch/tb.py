"""TensorBoard logging: the one module that imports tensorboard.

TensorBoard shows tag groups (the part of a tag before its first '/') in name order, so the
groups are numbered in the order a learner reads them:

- `1_loss/train`, `1_loss/eval`; `2_accuracy/exact_match`, `2_accuracy/token_accuracy`;
- `3_attention/<kind>/layer<L>/head<H>`, kind encoder, decoder or cross: an image of one map
  on a fixed held-out probe, teacher-forced on its target so that every frame has the same
  axes (the title shows the model's greedy output at that step). One map per image, at most
  CARD_WIDTH pixels wide: TensorBoard's IMAGES tab scales every image to a card 350 pixels
  wide, where a grid of all of a kind's heads had letters a few pixels high;
- `4_alignment/best` and `4_alignment/layer<L>/head<H>`, for tasks with an ideal alignment;
- `5_train/lr`, `5_train/grad_norm`, `5_train/tokens_per_s`;
- `6_entropy/layer<L>/head<H>`: each cross-attention head's attention entropy (nats);
- `7_gauges/<name>`: the gauges (see `gauges`) every log.gauge_every steps: exact, token
  accuracy, the hardest positions' loss, alignment, weight norm, the task's own; and the
  forecast's numbers while it makes them: the step of the click (`forecast_click_step`), the
  step of the target (`forecast_target_step`) and the exact match at the end
  (`forecast_end_exact`).

Pictures and per-head scores come from the attention snapshots that the attention recorder
takes every `log.attention_every` steps (by default every 25) and at the end (see
`timeline`, which also records them to attention.jsonl); the pictures are drawn with numpy and
Pillow (see `mapgrid.MapGrid`), so that they cost little next to training.
Text: `config` and `samples`. At the end, the run's hyperparameters for the HPARAMS tab.
"""

from __future__ import annotations

import secrets
import struct
import threading
import time
import unicodedata
import zlib
from typing import TYPE_CHECKING

import numpy as np

from minitfm.config import Config, flatten, to_yaml
from minitfm.run.instruments import (
    Ended,
    Evaluation,
    GaugesDue,
    Instrument,
    SnapshotDue,
    Started,
    TrainLine,
)

if TYPE_CHECKING:
    from minitfm.lab.attention.timeline import AttentionRecorder

TRAIN_TAGS = {"loss": "1_loss/train", "lr": "5_train/lr", "grad_norm": "5_train/grad_norm",
              "tokens_per_s": "5_train/tokens_per_s"}
EVAL_TAGS = {"loss": "1_loss/eval", "exact_match": "2_accuracy/exact_match",
             "token_accuracy": "2_accuracy/token_accuracy"}
ATTENTION_TAG = "3_attention/{kind}/layer{layer}/head{head}"
CARD_WIDTH = 350  # pixels: an image card of TensorBoard's IMAGES tab (tf-image-loader)
MAP_PIXELS = 272  # a map's longer side at most: 17 tokens in 16-pixel cells fit CARD_WIDTH
FONT_SIZE = 12  # pixels, shown at about that size in a card
ALIGNMENT_TAG = "4_alignment/{name}"
ENTROPY_TAG = "6_entropy/{name}"
GAUGE_TAG = "7_gauges/{name}"
NOT_PLOTTED = ("step", "split", "positions", "heads", "forecast", "shown")  # lists, words
FORECAST_PLOTTED = ("click_step", "target_step", "end_exact")  # the forecast's numbers
HPARAM_SECTIONS = ("task", "model", "train")  # with `seed`: what a run learns, not where
LONGEST_STEP = 10**9  # train.steps' limit: the widest step number a title can show
N_SAMPLES = 5
MARKDOWN_SYNTAX = frozenset("\\`*_[]<>&|")  # pairs text must not format, link or end a cell
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class TensorBoardLogger(Instrument):
    """Writes event files into the run directory (continued on --resume), when log.tensorboard
    is true; its pictures are the snapshots of `attention` (None: no pictures)."""

    def __init__(self, attention: AttentionRecorder | None = None):
        self.attention = attention
        self.writer = None  # made when the run starts, if log.tensorboard
        self.previous_hook = None
        self.cfg = self.task = None
        self.grids: dict = {}  # (kind, layer, head) -> its mapgrid.MapGrid, made when first drawn
        self.captions = None  # mapgrid.Captions: a snapshot's caption, drawn once per kind

    def on_start(self, run: Started) -> None:
        """Open the event files, with the config as text."""
        if not run.cfg.log.tensorboard:
            return
        from torch.utils.tensorboard import SummaryWriter

        from minitfm.lab.watch.crc32c import use_in_tensorboard

        use_in_tensorboard()  # its own checksums go a byte at a time, in pure Python
        # TensorBoard opens its event file with open(), which would follow a link planted at
        # its name (time, host, pid): a random end makes the name one no one can guess.
        # purge_step: a resumed run's events from the step after its checkpoint replace those a
        # process killed after that save wrote (TensorBoard hides the older ones; it takes the
        # first such mark in a run for its start, so a fresh run writes one at step 0).
        if run.step:
            after_earlier_files(run.run_dir)
        self.writer = SummaryWriter(log_dir=str(run.run_dir), purge_step=run.step + 1 if
                                    run.step else 0, filename_suffix=f".{secrets.token_hex(8)}")
        self.previous_hook = threading.excepthook
        threading.excepthook = self._quiet_write_errors
        self.cfg, self.task = run.cfg, run.task
        self.writer.add_text("config", "```\n" + to_yaml(run.cfg) + "\n```", 0)

    def _quiet_write_errors(self, args) -> None:
        """The event writer's thread on a full disk: training reports the failure in one line
        (its next write raises the same error), so no thread traceback."""
        if not issubclass(args.exc_type, OSError):
            self.previous_hook(args)

    def on_train_line(self, line: TrainLine) -> None:
        if self.writer is not None:
            record = line.record()
            for key, tag in TRAIN_TAGS.items():
                self.writer.add_scalar(tag, record[key], line.step)

    def on_evaluation(self, evaluation: Evaluation) -> None:
        if self.writer is None:
            return
        record, step = evaluation.record(), evaluation.step
        for key, tag in EVAL_TAGS.items():
            self.writer.add_scalar(tag, record[key], step)
        self.writer.add_text("samples", self._samples_table(evaluation.pairs,
                                                            evaluation.predictions), step)
        self.writer.flush()

    def on_snapshot(self, due: SnapshotDue) -> None:
        """The attention recorder's snapshot of this step, drawn (see `attention_images`)."""
        if self.writer is not None and self.attention is not None:
            snapshot = self.attention.take(due.step, due.model)
            if snapshot is not None:
                self.attention_images(snapshot)

    def on_gauges(self, due: GaugesDue) -> None:
        """The gauge reader's reading (see `gauges`), a scalar per gauge."""
        if self.writer is None or not due.reading:
            return
        for name, value in due.reading.items():
            if name not in NOT_PLOTTED and value is not None:
                self.writer.add_scalar(GAUGE_TAG.format(name=name), value, due.step)
        forecast = due.reading.get("forecast") or {}
        for name in FORECAST_PLOTTED:
            if forecast.get(name) is not None:
                self.writer.add_scalar(GAUGE_TAG.format(name=f"forecast_{name}"), forecast[name],
                                       due.step)

    def _samples_table(self, pairs: list, predictions: list) -> str:
        """The first held-out pairs and their predictions, a markdown table of text."""
        def cell(tokens) -> str:
            return markdown_text(self.task.format(tokens))

        rows = ["| input | target | prediction | ok |", "|---|---|---|---|"]
        for (src, tgt), pred in list(zip(pairs, predictions, strict=True))[:N_SAMPLES]:
            rows.append(f"| {cell(src)} | {cell(tgt)} | {cell(pred)} | "
                        f"{'yes' if pred == tgt else 'no'} |")
        return "\n".join(rows)

    def attention_images(self, snapshot) -> None:
        """A heatmap of every head of every kind on the probe, one per image; each
        cross-attention head's alignment score (tasks with an ideal alignment) and entropy."""
        from minitfm.lab.attention.probe import map_blocks, only

        step = snapshot.step
        caption = probe_caption(self.task, step, snapshot.probe.prediction, snapshot.target)
        for block in map_blocks(snapshot.probe, self.task):
            for layer in block.layers:
                for head in block.heads:
                    one = only(block, layer, head)
                    picture = self._grid(one, snapshot).frame(one, caption)
                    tag = ATTENTION_TAG.format(kind=block.kind, layer=layer, head=head)
                    self.writer.file_writer.add_summary(image_summary(tag, picture), step)
        if snapshot.alignment is not None:
            self._per_head(ALIGNMENT_TAG, snapshot.alignment, step)
            self.writer.add_scalar(ALIGNMENT_TAG.format(name="best"),
                                   float(snapshot.alignment.max()), step)
        self._per_head(ENTROPY_TAG, snapshot.entropy, step)

    def _per_head(self, tag: str, scores, step: int) -> None:
        """A scalar per head of scores (L, H), tagged `<group>/layer<L>/head<H>`."""
        for (layer, head), value in np.ndenumerate(scores.numpy()):
            self.writer.add_scalar(tag.format(name=f"layer{layer}/head{head}"), value, step)

    def _grid(self, block, snapshot):
        """The picture maker of one head's map, sized for the longest caption any step can
        have."""
        from minitfm.lab.attention.mapgrid import Captions, MapGrid
        from minitfm.lab.attention.probe import KIND_TITLES

        key = (block.kind, *block.layers, *block.heads)
        if key not in self.grids:
            self.captions = self.captions or Captions()
            tokens = self.task.vocab.tokens
            widest = max((i for i, t in enumerate(tokens) if not t.startswith("<")),
                         key=lambda i: len(tokens[i]))
            src, target = snapshot.probe.src, snapshot.target
            cap = self.task.max_target_len(len(src)) + 1  # greedy decoding's limit
            header = f"{KIND_TITLES[block.kind]}\n{probe_header(self.task, src, target)}"
            longest = probe_caption(self.task, LONGEST_STEP, [widest] * cap, target)
            self.grids[key] = MapGrid(block, header, longest, size=FONT_SIZE,
                                      map_pixels=MAP_PIXELS, captions=self.captions)
        return self.grids[key]

    def on_end(self, ended: Ended) -> None:
        """The run's hyperparameters (see `hparam_values`), in its own event file; then close.

        No experiment summary: TensorBoard then builds the HPARAMS table from every run's keys
        (ticking first the keys that differ between runs) and takes its metrics from the
        scalars above, in name order: loss and accuracy first. So no `hparam/*` copies. A run
        paused before any evaluation has nothing to compare yet; an interrupted one is closed.
        """
        from torch.utils.tensorboard.summary import hparams

        summary = ended.summary
        if self.writer is not None and "exact_match" in summary \
                and summary["status"] != "interrupted":
            # add_hparams would open a second writer; the same summaries go into ours instead.
            _, start, end = hparams(hparam_values(self.cfg), {EVAL_TAGS["exact_match"]: 0.0})
            for summary_proto in (start, end):
                self.writer.file_writer.add_summary(summary_proto, summary["step"])
            self.writer.flush()
        self.close()

    def close(self) -> None:
        if self.writer is None:
            return
        try:
            self.writer.close()
        finally:
            threading.excepthook = self.previous_hook
            self.writer = None


def probe_header(task, src: list[int], target: list[int]) -> str:
    """The probe, as every frame shows it."""
    fmt = task.format
    return (f"{task.name} · input {fmt(src)} → target {fmt(target)} (maps teacher-forced on "
            f"the target; colour ∝ √weight; ^ = <bos>)")


def probe_caption(task, step: int, prediction: list[int], target: list[int]) -> str:
    """The model's greedy output on the probe at `step`."""
    verdict = "✓" if prediction == target else "✗"
    return f"step {step} · greedy output {task.format(prediction)} {verdict}"


def after_earlier_files(run_dir) -> None:
    """Wait, if need be, until this second is later than every event file's in `run_dir`.

    TensorBoard reads a run's event files in name order, and a name starts with the second it
    was made in, then the host and the pid (as text: "10012" < "9876"). A run resumed within the
    second its killed process started would otherwise be read first, and its purge mark could
    not hide the killed process's later steps. At most a second, and only on resume."""
    seconds = [int(part) for path in run_dir.glob("events.out.tfevents.*")
               if (part := path.name.split(".")[3]).isdigit()]
    if seconds:
        time.sleep(max(0.0, max(seconds) + 1 - time.time()))


def markdown_text(text: str) -> str:
    """`text` as TensorBoard's markdown shows it, as text: each character that markdown or HTML
    reads as syntax (`|` ends a table cell, `<` starts a tag, ...) and each control character
    (a newline ends the table's row) written as a numeric character reference, `&#124;`."""
    return "".join(f"&#{ord(ch)};" if ch in MARKDOWN_SYNTAX or unicodedata.category(ch) == "Cc"
                   else ch for ch in text)


def image_summary(tag: str, picture: np.ndarray):
    """An RGB picture (height, width, 3) as a TensorBoard image summary, as `add_image` writes."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    height, width, _ = picture.shape
    image = Summary.Image(height=height, width=width, colorspace=3,
                          encoded_image_string=png_bytes(picture))
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def png_bytes(rgb: np.ndarray) -> bytes:
    """(height, width, 3) uint8 as a PNG file (IHDR, one IDAT, IEND; the W3C PNG spec). Every
    row is stored as its difference to the row above (filter type 2, "Up"): the pictures are
    cells of flat colour, so the differences are mostly 0, and zlib level 1 packs them about as
    small as Pillow's adaptive filters do, in a third of the time (docs/speed.md)."""
    height, width, _ = rgb.shape
    flat = rgb.reshape(height, -1)  # (height, 3 * width)
    rows = np.full((height, 1 + 3 * width), 2, dtype=np.uint8)  # each row: its filter type
    rows[0, 1:] = flat[0]  # the first row's "row above" is zeros
    rows[1:, 1:] = flat[1:] - flat[:-1]  # uint8: differences modulo 256, as PNG defines them

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (PNG_SIGNATURE + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + chunk(b"IEND", b""))


def hparam_values(cfg: Config) -> dict:
    """`seed` and the task.*, model.* and train.* keys: what makes runs learn differently
    (not name, device, threads or log.*, which say where a run went and how fast)."""
    return {key: value for key, value in flatten(cfg.model_dump()).items()
            if key == "seed" or key.partition(".")[0] in HPARAM_SECTIONS}
