"""Attention over training: at each of `log.attention_every`'s steps (by default at every
evaluation) a snapshot of the probe's cross-attention and of every cross-attention head's
scores, recorded to `attention.jsonl` and read back as a `Timeline`, which
`visualize-attention --over-training` draws (`over_training.py`) and the explorer's page embeds.

`attention.jsonl` holds one JSON object per snapshot (a resumed run appends; the last record of
a step counts):

- `step`, and `exact_match` of the evaluation at that step (null when none fell on it);
- `input`, `target`: the probe, the fixed held-out example TensorBoard shows; `source` and
  `decoder_input` (`<bos>` + the target): the tokens on the maps' axes;
- `alignment`: (L, H) each cross-attention head's alignment score (see `probe`) on 200 held-out
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from minitfm.errors import CheckpointError, MinitfmError, quote
from minitfm.lab.attention.probe import (
    ALIGNMENT_SAMPLES,
    LatestPass,
    Probe,
    pick_probe,
    run_probe,
    scores_of,
)
from minitfm.run.files import to_json
from minitfm.run.instruments import Evaluation, Instrument, SnapshotDue, Started
from minitfm.run.rundir import open_run_file, unreadable
from minitfm.tasks.base import BOS_ID, EOS_ID, Pair, Task

ATTENTION_FILE = "attention.jsonl"
MAP_DECIMALS, SCORE_DECIMALS = 3, 4
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
                 path: Path | None = None, active: bool = False, recorded: Pair | None = None,
                 passes: LatestPass | None = None):
        self.passes = passes or LatestPass()  # shared with the gauge reader (`LatestPass`)
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
        scores = scores_of(self.passes.at(step, model, self.task, self.pairs), self.task,
                           self.pairs)
        self.taken = Snapshot(step, probe, target, scores.soft, scores.entropy, exact_match)
        return self.taken

    def write(self, snapshot: Snapshot) -> None:
        """Append the snapshot's line to attention.jsonl (when recording)."""
        if self.path is None:
            return
        line = to_json(snapshot.record(self.task), separators=(",", ":"))
        with open_run_file(self.path, "a") as f:  # never through a link (see run.files)
            f.write(line + "\n")


def recorded_probe(path: Path, task: Task) -> Pair | None:
    """The probe of the last whole record of `path` (None: no file, no record, or one this
    task cannot read), as (source ids, target ids)."""
    last = None
    try:
        with open_run_file(path, "r") as f:  # a link or a FIFO is refused (see run.files)
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
        with open_run_file(path, "r") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = []
    except OSError as err:  # no permission, a link, a FIFO
        shown = f"'{path}'"
        raise CheckpointError(f"{unreadable(shown, err)}: {HOW_TO_RECORD}") from None
    except UnicodeDecodeError as err:
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
