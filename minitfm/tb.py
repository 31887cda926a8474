"""TensorBoard logging: the one module that imports tensorboard.

Tags: `train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `eval/loss`,
`eval/token_accuracy`, `eval/exact_match`; text `config` and `samples`; hparams with the
final metrics (`hparam/...`) in the same event file. Every `log.attention_every` steps and at
the end: images `attention/{encoder,decoder,cross}/layer<L>` (all heads of one layer side by
side, drawn by `viz.attention_figure` on a fixed held-out probe) and, for tasks with an ideal
alignment, scalars `alignment/layer<L>/head<H>` and `alignment/best`.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np

from minitfm.config import Config, flatten, to_yaml

TRAIN_SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s")
EVAL_SCALARS = ("loss", "token_accuracy", "exact_match")
N_SAMPLES = 5


class Logger(Protocol):
    """What training logs to: TensorBoard event files (`TensorBoardLogger`) or nothing."""

    def __enter__(self) -> Logger:
        """The logger itself; leaving the block closes it."""

    def __exit__(self, *exc) -> None:
        """Close, however the block ended."""

    def train(self, step: int, record: dict) -> None:
        """The scalars of a train record of metrics.jsonl."""

    def eval(self, step: int, record: dict, pairs: list, predictions: list) -> None:
        """The scalars of an eval record, and some held-out pairs with their predictions."""

    def attention(self, step: int, model) -> None:
        """Attention images and alignment scores of `model` at `step`."""

    def finish(self, summary: dict) -> None:
        """Hyperparameters with the final metrics."""

    def close(self) -> None:
        """Flush and close the files (a second call does nothing)."""


class NullLogger:
    """Used when `log.tensorboard` is false."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None: ...
    def train(self, step: int, record: dict) -> None: ...
    def eval(self, step: int, record: dict, pairs: list, predictions: list) -> None: ...
    def attention(self, step: int, model) -> None: ...
    def finish(self, summary: dict) -> None: ...
    def close(self) -> None: ...


class TensorBoardLogger(NullLogger):
    """Writes event files into the run directory (continued on --resume)."""

    def __init__(self, run_dir: Path, cfg: Config, task, eval_pairs: list):
        from torch.utils.tensorboard import SummaryWriter

        from minitfm.viz import ALIGNMENT_SAMPLES, pick_probe

        self.writer = SummaryWriter(log_dir=str(run_dir))
        self.previous_hook = threading.excepthook
        threading.excepthook = self._quiet_write_errors
        self.cfg, self.task = cfg, task
        # The same probe at every step, so the images show how one example's maps evolve.
        self.probe_src = pick_probe(eval_pairs)[0] if eval_pairs else None
        self.alignment_pairs = eval_pairs[:ALIGNMENT_SAMPLES]
        self.attention_step: int | None = None
        self.writer.add_text("config", "```\n" + to_yaml(cfg) + "\n```", 0)

    def __exit__(self, *exc) -> None:
        self.close()

    def _quiet_write_errors(self, args) -> None:
        """The event writer's thread on a full disk: training reports the failure in one line
        (its next write raises the same error), so no thread traceback."""
        if not issubclass(args.exc_type, OSError):
            self.previous_hook(args)

    def train(self, step: int, record: dict) -> None:
        for key in TRAIN_SCALARS:
            self.writer.add_scalar(f"train/{key}", record[key], step)

    def eval(self, step: int, record: dict, pairs: list, predictions: list) -> None:
        for key in EVAL_SCALARS:
            self.writer.add_scalar(f"eval/{key}", record[key], step)
        self.writer.add_text("samples", self._samples_table(pairs, predictions), step)
        self.writer.flush()

    def _samples_table(self, pairs: list, predictions: list) -> str:
        fmt = self.task.format
        rows = ["| input | target | prediction | ok |", "|---|---|---|---|"]
        for (src, tgt), pred in list(zip(pairs, predictions, strict=True))[:N_SAMPLES]:
            rows.append(f"| {fmt(src)} | {fmt(tgt)} | {fmt(pred)} | "
                        f"{'yes' if pred == tgt else 'no'} |")
        return "\n".join(rows)

    def attention(self, step: int, model) -> None:
        """Heatmaps of every layer and kind on the probe, and per-head alignment scores."""
        from minitfm.viz import (
            KINDS,
            alignment_scores,
            attention_figure,
            figure_to_array,
            map_blocks,
            run_probe,
        )

        if self.probe_src is None or step == self.attention_step:
            return  # train.finish logs the end again when it fell on an interval
        self.attention_step = step
        probe = run_probe(model, self.task, self.probe_src)
        text = f"{self.task.format(probe.src)} → {self.task.format(probe.prediction)}"
        for block in map_blocks(probe, self.task, KINDS):
            for r, layer in enumerate(block.layers):
                one_layer = replace(block, layers=[layer], weights=block.weights[r:r + 1])
                fig = attention_figure([one_layer], f"{self.task.name} · step {step} · {text}")
                # uint8 RGB: add_image would multiply floats by 255.
                self.writer.add_image(f"attention/{block.kind}/layer{layer}",
                                      figure_to_array(fig), step, dataformats="HWC")
        scores = alignment_scores(model, self.task, self.alignment_pairs)  # (L, H) or None
        if scores is not None:
            for (layer, head), value in np.ndenumerate(scores.numpy()):
                self.writer.add_scalar(f"alignment/layer{layer}/head{head}", value, step)
            self.writer.add_scalar("alignment/best", float(scores.max()), step)

    def finish(self, summary: dict) -> None:
        """Hyperparameters and final metrics, written into this run's own event file."""
        from torch.utils.tensorboard.summary import hparams

        metrics = {f"hparam/{k}": float(summary[k])
                   for k in ("exact_match", "token_accuracy", "loss") if k in summary}
        if not metrics:  # paused before any evaluation: nothing to compare yet
            return
        # add_hparams would open a second writer; the same summaries go into ours instead.
        for summary_proto in hparams(flatten(self.cfg.model_dump()), metrics):
            self.writer.file_writer.add_summary(summary_proto, summary["step"])
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, summary["step"])
        self.writer.flush()

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            threading.excepthook = self.previous_hook


def open_logger(run_dir: Path, cfg: Config, task, eval_pairs: list) -> Logger:
    """A TensorBoard logger, or one that does nothing when `log.tensorboard` is false."""
    if not cfg.log.tensorboard:
        return NullLogger()
    return TensorBoardLogger(run_dir, cfg, task, eval_pairs)
