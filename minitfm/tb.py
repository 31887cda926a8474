"""TensorBoard logging: the one module that imports tensorboard.

Tags: `train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `eval/loss`,
`eval/token_accuracy`, `eval/exact_match`; text `config` and `samples`; hparams with the
final metrics in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minitfm.config import Config, to_yaml

TRAIN_SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s")
EVAL_SCALARS = ("loss", "token_accuracy", "exact_match")
N_SAMPLES = 5


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

        self.writer = SummaryWriter(log_dir=str(run_dir))
        self.cfg, self.task = cfg, task
        self.writer.add_text("config", "```\n" + to_yaml(cfg) + "\n```", 0)

    def __exit__(self, *exc) -> None:
        self.close()

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
        for (src, tgt), pred in list(zip(pairs, predictions))[:N_SAMPLES]:
            rows.append(f"| {fmt(src)} | {fmt(tgt)} | {fmt(pred)} | "
                        f"{'yes' if pred == tgt else 'no'} |")
        return "\n".join(rows)

    def finish(self, summary: dict) -> None:
        metrics = {f"hparam/{k}": float(summary[k])
                   for k in ("exact_match", "token_accuracy", "loss") if k in summary}
        if metrics:
            self.writer.add_hparams(flatten(self.cfg.model_dump()), metrics, run_name=".",
                                    global_step=summary["step"])

    def close(self) -> None:
        self.writer.close()


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"d_model": 64}} -> {"model.d_model": 64}; None becomes "null"."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = "null" if value is None else value
    return flat


def open_logger(run_dir: Path, cfg: Config, task, eval_pairs: list):
    """A TensorBoard logger, or one that does nothing when `log.tensorboard` is false."""
    if not cfg.log.tensorboard:
        return NullLogger()
    return TensorBoardLogger(run_dir, cfg, task, eval_pairs)
