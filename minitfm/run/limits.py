"""What fits this machine: rough memory estimates, checked before anything is written.

A config that cannot fit is refused with one line naming the key that makes it large, its
value and the estimate, instead of an allocator traceback minutes later (or a machine
swapping). The estimates count float32 tensors the way `fast/kernels.py` keeps them for backward;
they are meant to be right within a factor of about two, which is enough to tell "fits" from
"needs a terabyte". A run checks as it starts (`run.session.start_training`); no torch here, so
`--print-config` and a sweep's plan refuse the same configs without loading it.
"""

from __future__ import annotations

import os
import resource

from minitfm.catalog import POSITIONALS, TASKS
from minitfm.errors import MinitfmError, quote
from minitfm.run.files import proc_value

FLOAT = 4  # bytes of a float32
PYTHON_INT = 8  # bytes per token of a Python list of small ints (a pointer; the ints are shared)
ADAMW_COPIES = 4  # weights, gradients, and AdamW's two moments
# Task pairs holds its training pairs as 2-byte ids (a symbol is at least a byte of the file),
# its held-out pairs as text: at most ~3 bytes of memory per byte of the files, with the
# temporaries of reading (measured: 2.4x for ASCII text, 2.5x for Korean; tasks/pairs.py).
PAIRS_BYTES_PER_FILE_BYTE = 3
FIXES = {"task.train_path": "use a part of the file", "task.eval_path": "use a part of the file"}


def available_bytes() -> int:
    """Memory this process may still use: MemAvailable, and the address-space limit (ulimit -v)."""
    free_kb = proc_value("/proc/meminfo", "MemAvailable")
    available = int(free_kb) * 1024 if free_kb is not None else \
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(available, soft) if soft != resource.RLIM_INFINITY else available


def human(n: float) -> str:
    """Bytes as `1.2 GB`."""
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def sequence_lengths(task_name: str, n: int) -> tuple[int, int]:
    """(source, decoder) tokens of the longest example with inputs of length `n`, as the task's
    spec states them (`catalog.TASKS`); BOS/EOS add one."""
    spec = TASKS[task_name]
    return spec.longest_source(n), spec.longest_target(n) + 1


def parameter_count(model, vocab_size: int) -> int:
    """Weights of the encoder-decoder (embeddings, attention, feed-forward; norms ignored)."""
    d, f = model.d_model, model.d_ff
    encoder = model.n_encoder_layers * (4 * d * d + 2 * d * f)
    decoder = model.n_decoder_layers * (8 * d * d + 2 * d * f)  # self- and cross-attention
    positions = model.max_len * d if POSITIONALS[model.positional].learned else 0
    return vocab_size * d + encoder + decoder + positions


def activation_bytes(model, batch: int, src: int, tgt: int, vocab_size: int) -> int:
    """Tensors one forward keeps for backward: per layer, projections and (B, H, Q, K) maps."""
    d, f, h = model.d_model, model.d_ff, model.n_heads
    encoder = model.n_encoder_layers * ((10 * d + 2 * f) * src + 2 * h * src * src)
    decoder = model.n_decoder_layers * ((16 * d + 2 * f) * tgt + 2 * h * tgt * (tgt + src))
    logits = 3 * tgt * vocab_size  # logits, softmax, gradient
    return FLOAT * batch * (encoder + decoder + logits)


def model_parts(cfg) -> list[tuple[str, int, int]]:
    """(key, value, bytes) of what a model of `cfg` holds however it is used."""
    vocab = TASKS[cfg.task.name].vocab_size(cfg.task.n_symbols)
    n = cfg.model.max_len
    return [
        ("model.d_model", cfg.model.d_model,
         ADAMW_COPIES * FLOAT * parameter_count(cfg.model, vocab)),
        ("model.max_len", n, n * n + FLOAT * n * cfg.model.d_model),  # causal mask, positions
        ("task.n_symbols", cfg.task.n_symbols, 100 * vocab),  # the vocabulary's strings
    ]


def training_parts(cfg) -> list[tuple[str, int, int]]:
    """(key, value, bytes) of a training run of `cfg`: model, one batch, the held-out set."""
    src, tgt = sequence_lengths(cfg.task.name, cfg.task.max_len)
    vocab = TASKS[cfg.task.name].vocab_size(cfg.task.n_symbols)
    batch = activation_bytes(cfg.model, cfg.train.batch_size, src, tgt, vocab)
    # The batch grows with its size and (quadratically) with the length: blame the one further
    # from its default.
    by_length = cfg.task.max_len / 16 >= cfg.train.batch_size / 128
    key, value = ("task.max_len", cfg.task.max_len) if by_length else \
        ("train.batch_size", cfg.train.batch_size)
    held_out = PYTHON_INT * cfg.train.eval_samples * (src + tgt)
    return [*model_parts(cfg), (key, value, batch),
            ("train.eval_samples", cfg.train.eval_samples, held_out), *data_parts(cfg)]


def data_parts(cfg) -> list[tuple[str, str, int]]:
    """(key, quoted path, bytes) of the files task pairs reads, from their sizes alone: the
    check comes before they are read (a missing file is the task's to report)."""
    if cfg.task.name != "pairs":
        return []
    parts = []
    for key in ("task.train_path", "task.eval_path"):
        path = getattr(cfg.task, key.split(".")[1])
        try:
            size = os.stat(path).st_size if path is not None else 0
        except (OSError, ValueError):
            size = 0
        if size:
            parts.append((key, quote(path), PAIRS_BYTES_PER_FILE_BYTE * size))
    return parts


def decoding_parts(cfg, samples: int, max_len: int, batch_size: int,
                   names: tuple[str, str] = ("--samples", "--max-len")) -> list:
    """(key, value, bytes) of decoding `samples` inputs of up to `max_len` tokens."""
    src, tgt = sequence_lengths(cfg.task.name, max_len)
    vocab = TASKS[cfg.task.name].vocab_size(cfg.task.n_symbols)
    chunk = activation_bytes(cfg.model, min(batch_size, samples), src, tgt,
                             vocab) // 2  # no backward: about half
    return [*model_parts(cfg), (names[1], max_len, chunk),
            (names[0], samples, PYTHON_INT * samples * (src + tgt))]


def check_fits(parts: list[tuple[str, int, int]], what: str, device=None) -> None:
    """Refuse when the parts together clearly exceed the memory this process can use: the
    host's, or on a CUDA `device` (a torch.device) the GPU's free memory."""
    total = sum(size for _, _, size in parts)
    available, where = available_bytes(), "this machine has"
    if device is not None and device.type == "cuda":
        available, where = gpu_free_bytes(device), f"the GPU ({device}) has"
    if total <= available:
        return
    key, value, size = max(parts, key=lambda part: part[2])
    raise MinitfmError(f"{key} ({value}) needs ~{human(size)} for {what} (~{human(total)} in "
                       f"all); {where} {human(available)} available: "
                       f"{FIXES.get(key, f'lower {key}')}")


def gpu_free_bytes(device) -> int:
    """The free memory of a CUDA device, as its driver counts it (torch is loaded by then)."""
    import torch  # only for a CUDA device: the rest of this module needs no torch

    return torch.cuda.mem_get_info(device)[0]
