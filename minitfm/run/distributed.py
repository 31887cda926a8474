"""Data-parallel training under torchrun: one process per device, each one rank of the job.

torchrun starts the processes and sets `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR` and
`MASTER_PORT`; `session` joins them into one process group (gloo on CPU, NCCL on CUDA) and
leaves it at the end. Every rank holds the same model; DistributedDataParallel averages the
gradients during backward, so the same AdamW step keeps every copy identical. The collectives
below are the few the training loop needs; alone (no torchrun) they hand back their input, so
the single-process path does exactly what it did before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as tdist

from minitfm.errors import MinitfmError, RunFailed

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Dist:
    """This process's place in the job: rank 0 of 1 when not started by torchrun."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = None  # under torchrun: the one device this rank trains on

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes the run directory and shows progress."""
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """What a training step calls: the model alone, its DDP wrapper under torchrun."""
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean of `tensor` over ranks (a NaN on any rank makes it NaN everywhere)."""
        if self.world_size == 1:
            return tensor
        total = tensor.detach().clone()
        tdist.all_reduce(total)  # a sum: gloo has no average
        return total / self.world_size

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over ranks, in float64 so that counts stay exact."""
        if self.world_size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        tdist.all_reduce(tensor)
        return tensor.tolist()

    def all_max(self, value: int) -> int:
        """The largest `value` of any rank: every rank takes the same decision."""
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        tdist.all_reduce(tensor, op=tdist.ReduceOp.MAX)
        return int(tensor.item())

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (pickled: for small things such as RNG states)."""
        if self.world_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        tdist.all_gather_object(gathered, obj)
        return gathered

    def on_all_ranks(self, err: Exception) -> Exception:
        """Mark an error that every rank raises together: the CLI prints rank 0's only
        (`err.silent` is true on the other ranks)."""
        err.silent = not self.is_main
        return err

    def from_main(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on rank 0 only; every rank gets its result, or raises its error."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except (MinitfmError, OSError) as err:  # a rank left waiting would hang
                error = err
        if self.world_size > 1:
            box = [(result, error)]
            tdist.broadcast_object_list(box, src=0)
            result, error = box[0]
        if error is not None:
            raise self.on_all_ranks(error)
        return result


def from_env() -> Dist:
    """The job torchrun describes in the environment; rank 0 of 1 without it."""
    world_size = env_int("WORLD_SIZE", 1)
    if world_size == 1:
        return Dist()
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise MinitfmError(f"WORLD_SIZE ({world_size}) is set but {', '.join(missing)} "
                           f"{'is' if len(missing) == 1 else 'are'} not: start minitfm with "
                           f"torchrun (see README, Distributed training), or unset WORLD_SIZE")
    return Dist(env_int("RANK"), world_size, env_int("LOCAL_RANK"))


def env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise MinitfmError(f"environment variable {name} ({value!r}) must be an integer: "
                           f"it is set by torchrun") from None


def rank_device(name: str, local_rank: int) -> torch.device:
    """Under torchrun each rank trains on one device: the CPU, or GPU number LOCAL_RANK."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if name not in ("auto", "cuda"):
        raise MinitfmError(f"device ({name!r}) names one GPU, but under torchrun each process "
                           f"takes cuda:LOCAL_RANK: use device=cuda or device=auto")
    if not torch.cuda.is_available():
        raise MinitfmError(f"device ({name!r}) asked for CUDA but none is available: use "
                           f"device=cpu (gloo) or device=auto")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise MinitfmError(f"LOCAL_RANK {local_rank} needs cuda:{local_rank} but this machine "
                           f"has {count} CUDA device(s): start at most --nproc_per_node={count}")
    return torch.device("cuda", local_rank)


@contextmanager
def session(device_name: str) -> Iterator[Dist]:
    """This process's part of the torchrun job (if any), process group included, while inside.

    A process group the caller made already is used and left to them; else one is made here
    and destroyed on the way out (torch cannot safely make a second one in the same job).
    """
    dist = from_env()
    if dist.world_size == 1:
        yield dist
        return
    dist = replace(dist, device=rank_device(device_name, dist.local_rank))
    owned = not tdist.is_initialized()
    if owned:
        join(dist)
    try:
        yield dist
        tdist.barrier()  # no rank returns before rank 0 has written the last files
    except RuntimeError as err:  # DistError, or gloo's plain one when a peer died
        if not isinstance(err, tdist.DistError) and "by peer" not in str(err):
            raise
        raise RunFailed(f"rank {dist.rank} lost the other ranks ({first_line(err)[:120]}): "
                        f"one of them stopped first; its own error says why") from None
    finally:
        if owned:
            tdist.destroy_process_group()


def join(dist: Dist) -> None:
    """init_process_group from torchrun's environment: NCCL for CUDA, gloo for the CPU."""
    cuda = dist.device.type == "cuda"
    if cuda:
        torch.cuda.set_device(dist.device)  # NCCL and all_gather_object use the current device
    backend = "nccl" if cuda else "gloo"
    try:
        tdist.init_process_group(backend, rank=dist.rank, world_size=dist.world_size,
                                 device_id=dist.device if cuda else None)
    except (RuntimeError, ValueError) as err:
        raise MinitfmError(f"rank {dist.rank} of {dist.world_size} cannot join the torchrun job "
                           f"({backend}, {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
                           f"): {first_line(err)}") from None


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
