"""The Python API: load a trained run, decode with it, look at its attention, evaluate, train.

    >>> from minitfm import load_run, train
    >>> run = load_run("runs/reverse-20261121-101500", checkpoint="best")
    >>> run.predict(["3 1 4"])
    ['4 1 3']
    >>> maps = run.attention("3 1 4")
    >>> maps.cross[0].shape  # layer 0: (heads, query: <bos> 4 1 3, key: 3 1 4)
    torch.Size([4, 4, 3])
    >>> report = run.evaluate(min_len=17, max_len=32)  # the dict `minitfm eval --json` prints
    >>> run = train("configs/copy.yaml", train__steps=50)  # `train.steps=50`: __ for a dot

Each call goes through the functions the command line uses, so it gives the same numbers:
`load_run` reads a RUN argument and `--checkpoint`, `Run.predict` is `minitfm predict`,
`Run.evaluate` is `minitfm eval --json`, `Run.attention` holds the maps `minitfm
visualize-attention` draws, and `train` is `minitfm train`. Mistakes raise
`minitfm.errors.MinitfmError` (a subclass) with the one-line message the CLI prints.

Shapes: H n_heads, S source length, T decoder input length (<bos> + the output; the query at
row t writes output token t, and the last row writes EOS).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from minitfm.book.metrics import EVAL_BATCH_SIZE
from minitfm.book.model import Seq2SeqTransformer, default_device
from minitfm.config import Config, load_config
from minitfm.errors import MinitfmError
from minitfm.lab.evaluate import eval_report, load_model, predict_lines
from minitfm.lab.viz import KINDS, map_blocks, read_input, run_probe
from minitfm.run.rundir import find_run_dir, pick_checkpoint
from minitfm.tasks.base import Task, eval_set


@dataclass
class Attention:
    """The attention maps of one input: per layer a tensor (heads, query, key) of weights
    (each row sums to 1), and the tokens that label the query and key axes."""

    source: list[str]  # encoder tokens: queries and keys of `encoder`, keys of `cross`
    decoder_input: list[str]  # <bos> + the output: queries of `decoder` and `cross`
    prediction: str  # the greedy output, as `predict` writes it for spaced input
    encoder: list[Tensor] = field(repr=False)  # per layer (H, S, S)
    decoder: list[Tensor] = field(repr=False)  # per layer (H, T, T)
    cross: list[Tensor] = field(repr=False)  # per layer (H, T, S)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(query tokens, key tokens) of the maps of `kind`: encoder, decoder or cross.

        >>> queries, keys = maps.labels("cross")  # (['<bos>', '4', '1', '3'], ['3', '1', '4'])
        """
        if kind not in KINDS:
            raise MinitfmError(f"kind ({kind!r}) must be one of {', '.join(KINDS)}")
        queries = self.source if kind == "encoder" else self.decoder_input
        return queries, self.decoder_input if kind == "decoder" else self.source


@dataclass
class Run:
    """A trained model loaded from a checkpoint, in eval mode, with its config and task."""

    checkpoint: Path  # the .pt file
    step: int  # the training step it was saved at
    config: Config = field(repr=False)
    task: Task = field(repr=False)
    model: Seq2SeqTransformer = field(repr=False)
    device: torch.device = field(repr=False)

    @property
    def run_dir(self) -> Path | None:
        """The run directory holding the checkpoint (None for a loose .pt file)."""
        return find_run_dir(self.checkpoint)

    def predict(self, inputs: str | Sequence[str], heads_off: Sequence = (),
                mode: str = "zero") -> str | list[str]:
        """Greedy-decode inputs in task syntax; one string in, one out; a list in, a list out.

        Outputs are written as the inputs are (`"314"` -> `"413"`, `"12+34"` -> `"46"`). An
        input longer than the trained lengths gives a UserWarning, a bad input a MinitfmError.
        `heads_off` switches attention heads off, as `minitfm ablate` does: (kind, layer, head)
        triples, kind "encoder", "decoder" or "cross"; `mode` "zero" or "mean" (the mean over
        the held-out set `minitfm ablate` decodes).

        >>> run.predict(["3 1 4", "2 7"])
        ['4 1 3', '7 2']
        >>> run.predict("3 1 4", heads_off=[("cross", 1, 2)], mode="mean")
        """
        from minitfm.lab.ablate import ablation_pairs, edited_heads, switched_off

        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        pairs = ablation_pairs(self.config, self.task) if mode == "mean" and heads_off else []
        edits = switched_off(self.model, self.task, pairs, self.device, heads_off, mode)
        with edited_heads(self.model, edits):
            result = predict_lines(self.config, self.task, self.model, self.device,
                                   list(enumerate(texts, 1)))
        if result.error is not None:
            raise result.error
        if result.warning:
            warnings.warn(result.warning, stacklevel=2)
        outputs = [row["output"] for row in result.rows]
        return outputs[0] if isinstance(inputs, str) else outputs

    def attention(self, text: str | None = None) -> Attention:
        """The maps of one input (default: the held-out example TensorBoard shows).

        >>> maps = run.attention("3 1 4")
        >>> maps.encoder[0].shape, maps.decoder[0].shape  # (H, S, S), (H, T, T)
        (torch.Size([4, 3, 3]), torch.Size([4, 4, 4]))
        """
        cfg, task = self.config, self.task
        held_out = eval_set(task, cfg.train.eval_samples, cfg.task.eval_seed) if text is None \
            else []
        probe = run_probe(self.model, task, read_input(cfg, task, text, held_out))
        blocks = {block.kind: block for block in map_blocks(probe, task)}
        maps = probe.maps
        return Attention(blocks["encoder"].keys, blocks["decoder"].keys,
                         task.format(probe.prediction), maps.encoder, maps.decoder, maps.cross)

    def evaluate(self, samples: int = 1000, min_len: int | None = None,
                 max_len: int | None = None, seed: int | None = None,
                 batch_size: int = EVAL_BATCH_SIZE) -> dict:
        """The dict `minitfm eval --json` prints: exact match, token accuracy, loss, per length.

        >>> report = run.evaluate(min_len=17, max_len=32)  # beyond the trained lengths
        >>> report["exact_match"], report["per_length"]["17"]["exact_match"]
        """
        for name, value in (("samples", samples), ("min_len", min_len), ("max_len", max_len),
                            ("batch_size", batch_size)):
            if value is not None and value < 1:
                raise MinitfmError(f"{name} ({value}) must be at least 1")
        return eval_report(self.config, self.task, self.model, self.device, self.checkpoint,
                           self.step, samples=samples, min_len=min_len, max_len=max_len,
                           seed=seed, batch_size=batch_size)


def load_run(run: str | Path | None = None, checkpoint: str = "best") -> Run:
    """Load a run directory or a .pt file (None: the most recent run under ./runs).

    `checkpoint` is "best" (highest exact match; last.pt, with a UserWarning, while the run
    has none) or "last", as `--checkpoint` on the command line.

    >>> run = load_run("runs/copy-20261121-101500", checkpoint="last")
    """
    path, note = pick_checkpoint(run, checkpoint)
    if note:
        warnings.warn(note, stacklevel=2)
    device = default_device()
    cfg, task, model, step = load_model(path, device)
    return Run(path, step, cfg, task, model, device)


def train(config: str | Path | dict | Config | None = None, /, *,
          run_dir: str | Path | None = None, progress: bool = True, **overrides: Any) -> Run:
    """Train as `minitfm train CONFIG KEY=VALUE...` does; the new run, loaded (best checkpoint).

    `config` is a YAML file, a dict of the same sections, a Config, or None for the built-in
    default (configs/reverse.yaml). Each override is a keyword argument named by the config
    key with `__` for each dot, its value a Python value: `train__steps=50` is
    `train.steps=50`, `model__positional="rope"`, `seed=1`; `**{"train.steps": 50}` works
    too. `run_dir` is `--run-dir`; `progress=False` trains silently.

    >>> run = train("configs/copy.yaml", train__steps=50, model__n_heads=2)
    >>> run = train({"task": {"name": "sort"}}, **{"train.steps": 50}, progress=False)
    """
    from minitfm.app.progress import ConsoleReporter
    from minitfm.run.memory import keep_freed_memory

    data = config.model_dump() if isinstance(config, Config) else config
    cfg = load_config(data, [(key.replace("__", "."), value) for key, value in overrides.items()])
    keep_freed_memory()  # as the CLI does: fewer page faults, faster steps
    reporter = ConsoleReporter() if progress else None
    try:
        summary = train_run(cfg, run_dir=None if run_dir is None else Path(run_dir),
                            reporter=reporter)
    finally:
        if reporter is not None:
            reporter.stop()
    return load_run(summary["run_dir"])


def train_run(cfg: Config | None, **options: Any) -> dict[str, Any]:
    """One run as `minitfm train` makes it: `run.session.train` with the instruments attached
    (TensorBoard event files, attention.jsonl); `options` are that function's; the summary."""
    from minitfm.lab.tb import open_logger
    from minitfm.lab.timeline import open_recorder
    from minitfm.run.session import train

    return train(cfg, open_logger=open_logger, open_recorder=open_recorder, **options)
