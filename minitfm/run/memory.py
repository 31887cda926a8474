"""Process memory: how much a run used at its peak, and keeping freed memory for reuse.

Each training step allocates and frees the same activations again. glibc's malloc gives
freed blocks of a few MB back to the kernel (munmap, or trimming the top of its heap), so the
next step takes a page fault for every 4 KB it touches again: over a thousand per step at the
default config, and on a virtual machine each one is expensive. `keep_freed_memory` raises
both thresholds, so the blocks stay in the process and are reused; peak memory is unchanged,
since that is what the steps hold at once anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys

from minitfm.run.files import proc_value

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h: free memory above this at the heap top is trimmed
M_MMAP_THRESHOLD = -3  # blocks at least this large get their own mmap, unmapped when freed
KEEP_BELOW = 32 * 2**20  # the largest mmap threshold glibc accepts on 64-bit: 32 MB


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks under 32 MB for reuse; False if not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BELOW) and mallopt(M_TRIM_THRESHOLD, 2**30))


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """Peak resident memory of a process in MB (None once it has gone).

    Linux's VmHWM counts only since the process's exec. getrusage's ru_maxrss, the fallback
    for this process elsewhere, also counts the parent's pages a child held before its exec.
    """
    peak_kb = proc_value(f"/proc/{pid}/status", "VmHWM")
    if peak_kb is not None:
        return int(peak_kb) / 1024  # kB -> MB
    if pid != "self":
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
