"""Shared test settings: pinned threads so CPU results are repeatable.

OMP_NUM_THREADS also pins every `minitfm` subprocess a test starts, and makes `threads: auto`
resolve to 1 whatever other minitfm processes run on the machine.
"""

import os

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)
