"""Shared test settings: pinned threads so CPU results are repeatable.

OMP_NUM_THREADS also pins every `minitfm` subprocess a test starts, and makes `threads: auto`
resolve to 1 whatever other minitfm processes run on the machine.
"""

import os
import signal

os.environ["OMP_NUM_THREADS"] = "1"

# Ctrl-C as a terminal gives it. A suite started in the background of a shell without job
# control (`make test &` in a script) inherits SIGINT ignored, and so would every process its
# tests start: minitfm keeps a Ctrl-C its parent ignores ignored (run/signals.py), so the tests
# of Ctrl-C would fail there (5 did, 2026-12-08), testing what a user at a terminal never sees.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import torch  # noqa: E402

torch.set_num_threads(1)

import pytest  # noqa: E402

NO_CUDA = "no CUDA device is present (torch.cuda.is_available() is False)"


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked `cuda` with one reason, on a machine without a CUDA device."""
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))

