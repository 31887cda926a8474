"""What a run trains and saves: the loop's state with its RNG streams, made fresh or restored.

`RunState` is the book's `TrainState` plus this process's place under torchrun; its
`state_dict` is what a checkpoint holds to continue a run exactly. `step_forward` is what a
training step calls on this machine: the model itself on a CPU, inside bfloat16 autocast on
CUDA, wrapped in DistributedDataParallel under torchrun (see `distributed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from minitfm.book.loop import TrainState
from minitfm.catalog import position_shortfall
from minitfm.config import Config
from minitfm.errors import MinitfmError
from minitfm.learn.code import Code, code_for
from minitfm.learn.workbook import learner_errors
from minitfm.run.checkpoint import optimizer_state
from minitfm.run.distributed import Dist
from minitfm.tasks import make_task
from minitfm.tasks.base import Task


@dataclass
class RunState(TrainState):
    """The loop's state and what a checkpoint must hold besides it to continue a run exactly."""

    dist: Dist = field(default_factory=Dist)  # this rank under torchrun; else rank 0 of 1
    code: Code | None = None  # which code trains (model.code): its loop and metrics run too

    def state_dict(self) -> dict[str, Any]:
        """Plain containers and tensors only, so `weights_only=True` can load it."""
        state = {
            "step": self.step,
            "config": self.cfg.model_dump(),
            "vocab": list(self.task.vocab.tokens),
            **self.task.checkpoint_data(),  # pairs: its held-out pairs, lengths, file hash
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "best_exact_match": self.best_exact_match,
            **(self.code.record() if self.code is not None else {}),  # a workbook: what ran
            "rng": {"torch": torch.get_rng_state(), "data": self.data_rng.get_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        }
        if self.dist.world_size > 1:  # under torchrun, "rng" is rank 0's; each rank's goes here
            state["rng"]["ranks"] = self.dist.all_gather(self.rank_streams())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore model, optimizer, step and every RNG; lr and weight decay come from the
        config (they may change on resume), the schedule from the step."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(optimizer_state(state["optimizer"], self.optimizer))
        self.step = state["step"]
        self.best_exact_match = state["best_exact_match"]
        torch.set_rng_state(state["rng"]["torch"])
        self.data_rng.set_state(state["rng"]["data"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        if self.dist.world_size > 1:
            self.load_rank_streams(state["rng"].get("ranks", []))

    def rank_streams(self) -> dict[str, torch.Tensor]:
        """This rank's own RNG states: dropout (torch, CUDA) and training data."""
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {"torch": torch.get_rng_state(), "data": self.data_rng.get_state(),
                "cuda": cuda if cuda is not None else torch.empty(0, dtype=torch.uint8)}

    def load_rank_streams(self, ranks: list[dict[str, torch.Tensor]]) -> None:
        """Each rank continues its own streams if as many ranks saved them, else starts anew."""
        rank = self.dist.rank
        if len(ranks) == self.dist.world_size:  # the same world size: an exact resume
            torch.set_rng_state(ranks[rank]["torch"])
            self.data_rng.set_state(ranks[rank]["data"])
            if len(ranks[rank]["cuda"]):
                torch.cuda.set_rng_state(ranks[rank]["cuda"], self.device)
        elif rank > 0:  # rank 0 continues the saved streams; the others must not repeat them
            seed = hash((self.cfg.seed, rank, self.step)) % 2**63  # ints hash alike everywhere
            torch.manual_seed(seed)
            self.data_rng.manual_seed(seed)


def init_state(cfg: Config, device: torch.device, dist: Dist = Dist()) -> RunState:
    """Task, model (seeded init) and optimizer for a fresh run."""
    task = make_task(cfg.task)
    check_lengths(cfg, task)
    code = code_for(cfg.model.code)
    torch.manual_seed(cfg.seed)
    with learner_errors(code.workbook):  # a workbook's code failing: one line, its file and line
        model = code.build(cfg, task).to(device)
        if dist.rank > 0:  # under torchrun: the same initial weights, but its own dropout masks
            torch.manual_seed(cfg.seed + dist.rank)
        optimizer = code.loop.make_optimizer(model, cfg.train)
    data_rng = torch.Generator().manual_seed(cfg.seed + dist.rank)  # and its own batches
    return RunState(cfg, task, model, optimizer, data_rng, device=device,
                    model_or_wrapper=step_forward(model, device, dist), dist=dist, code=code)


def step_forward(model: torch.nn.Module, device: torch.device,
                 dist: Dist) -> Callable[[Tensor, Tensor], Tensor]:
    """What a training step calls for the logits: the model, or its DDP wrapper under torchrun
    (which averages the gradients over processes during backward); on CUDA inside bfloat16
    autocast (on the CPU it was slower: see docs/speed.md)."""
    forward = dist.wrap(model)
    return BFloat16(forward) if device.type == "cuda" else forward


class BFloat16:
    """A forward pass inside `torch.autocast("cuda", dtype=torch.bfloat16)`."""

    def __init__(self, forward: Callable[[Tensor, Tensor], Tensor]):
        self.forward = forward

    def __call__(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.forward(src, tgt_in)


def check_lengths(cfg: Config, task: Task) -> None:
    """The model must have positions for the longest source and target of training."""
    task.check_positions(cfg.model.max_len)  # a pairs task: every pair of its files
    needed = task.positions_for_source(task.max_source_len(cfg.task.max_len))
    short = position_shortfall(cfg.model, needed, training=True)
    if short is not None:
        key, limit, needed = short
        raise MinitfmError(f"{key} ({limit}) is too small for task.max_len ({cfg.task.max_len}): "
                           f"sequences need {needed} positions; raise {key}")
