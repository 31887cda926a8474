"""Shared test settings: pinned threads so CPU results are repeatable."""

import torch

torch.set_num_threads(1)
