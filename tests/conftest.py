"""Shared test settings: pinned threads so CPU results are repeatable.

OMP_NUM_THREADS also pins every `minitfm` subprocess a test starts, and makes `threads: auto`
resolve to 1 whatever other minitfm processes run on the machine.
"""

import os
import signal
import warnings

os.environ["OMP_NUM_THREADS"] = "1"

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


STOPPING = {signal.SIGINT, signal.SIGTERM}


@pytest.fixture(autouse=True)
def stopping_signals_as_found():
    """Each test starts with Ctrl-C and SIGTERM as the test before found them. A test (or a
    library it drives) that leaves one ignored or blocked in this worker would make every later
    test of a Ctrl-C fail there, and every process they start inherit it (seen once in a full
    run, 2026-12-08, on one worker, its cause not found): what was there is put back, with a
    warning naming the test that left it."""
    before = {signum: signal.getsignal(signum) for signum in STOPPING}
    yield
    ignored = {signum for signum in STOPPING if signal.getsignal(signum) is signal.SIG_IGN
               and before[signum] is not signal.SIG_IGN}
    blocked = STOPPING & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if not ignored and not blocked:
        return
    for signum in ignored:
        signal.signal(signum, before[signum])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    names = ", ".join(sorted(signal.Signals(s).name for s in ignored | blocked))
    warnings.warn(f"this test left {names} ignored or blocked in its process (put back)",
                  stacklevel=1)
