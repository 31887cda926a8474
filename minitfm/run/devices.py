"""Which device a run trains on: the config's `device`, checked against this machine."""

from __future__ import annotations

import torch

from minitfm.errors import MinitfmError


def default_device() -> torch.device:
    """CUDA when there is a GPU, else the CPU (the choice `device: auto` makes)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when present, else CPU; an absent CUDA device is a clear error."""
    if name == "auto":
        return default_device()
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise MinitfmError(f"device ({name!r}) asked for CUDA but none is available: "
                               f"use device=cpu or device=auto")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise MinitfmError(f"device ({name!r}) does not exist: this machine has "
                               f"{torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)
