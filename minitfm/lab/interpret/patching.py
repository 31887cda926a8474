"""Activation patching: which activations carry what makes two answers differ.

Take a clean input and a corrupted one of the same length. Both runs are teacher-forced on BOS +
the clean answer (the model's greedy output for the clean input), so they differ only in their
source. The corrupted answer (its greedy output) names, at each output position t where it
differs from the clean one, the token the clean answer's token is scored against: the logit
difference LD_t = z_t[clean token] - z_t[corrupted token], summed over those positions (and over
the pairs of a batch).

Patching an activation reruns the corrupted input with that one activation replaced by its value
in the clean run. Its *restored share* is

    (LD_patched - LD_corrupted) / (LD_clean - LD_corrupted):

0 when the patch changes nothing, 1 when it brings back the clean run's preference on its own
(Meng et al. 2022 call this causal tracing; Wang et al. 2022 patch heads; Heimersheim and Nanda
2024 say how to read it). The activations:

- each head's output before W^O, at every position at once: the hook point `heads` that
  `ablate` switches off, for encoder, decoder and cross-attention alike;
- the residual stream at one position: the input of each encoder layer, the encoder's output
  (the memory the cross-attention reads), and the output of each decoder layer. The decoder's
  input is the same in both runs, so it is not patched.

Patching an encoder point, or the last decoder layer's output, at every position reproduces the
clean run (everything after it depends on it alone; an earlier decoder layer's output does not,
as the layers after it still read the corrupted memory), and patching nothing reproduces the
corrupted run: the tests check both, in float64.

Shapes: B batch, S source len, T decoder len, D d_model, H n_heads, K d_head, V vocab size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from minitfm.book.metrics import predict
from minitfm.book.model import eval_mode
from minitfm.catalog import SPECIAL_TOKENS
from minitfm.errors import MinitfmError
from minitfm.lab.attention.probe import KINDS
from minitfm.lab.interpret.ablate import edited_heads, layer_counts, this_threads
from minitfm.lab.measure.evaluate import input_limit, length_warning
from minitfm.tasks.base import Task

Edit = Callable[[Tensor], Tensor]  # an activation in, the activation to go on with out
_, BOS, EOS = SPECIAL_TOKENS  # the tokens every vocabulary starts with


# --- where the residual stream is read: hooks before or after a module ---

def residual_points(model) -> dict[tuple[str, int], tuple[nn.Module, bool]]:
    """(stream, layer) -> (module, before), named as `point_name` says: the input of encoder
    layer i is ("encoder", i), the memory ("encoder", n_encoder_layers), the output of decoder
    layer i ("decoder", i)."""
    points = {("encoder", i): (layer, True) for i, layer in enumerate(model.encoder_layers)}
    points[("encoder", len(model.encoder_layers))] = (model.encoder_norm, False)
    points.update({("decoder", i): (layer, False) for i, layer in enumerate(model.decoder_layers)})
    return points


def point_name(stream: str, layer: int, n_encoder_layers: int) -> str:
    """A residual point as every view names it: "encoder in L0" ... "memory", "decoder out L0"
    ... (the explorer's page too)."""
    if stream == "decoder":
        return f"decoder out L{layer}"
    return "memory" if layer == n_encoder_layers else f"encoder in L{layer}"


def first(value):
    """A layer returns (x, maps...), a norm x: the residual stream x either way."""
    return value[0] if isinstance(value, tuple) else value


def with_first(value, x: Tensor):
    """`value` with its residual stream replaced by `x`."""
    return (x, *value[1:]) if isinstance(value, tuple) else x


@contextmanager
def residual_edits(model, edits: dict[tuple[str, int], Edit]) -> Iterator[None]:
    """Each edit applied to the residual stream at its (stream, layer) for the block, in this
    thread's passes only (as `ablate.edited_heads`); every hook removed after, even if the
    block raises."""
    handles = []
    try:
        for key, edit in edits.items():
            module, before = residual_points(model)[key]
            if before:
                hook = (lambda e: lambda _m, args: (e(args[0]), *args[1:]))(edit)
                handles.append(module.register_forward_pre_hook(this_threads(hook)))
            else:
                hook = (lambda e: lambda _m, _args, out: with_first(out, e(first(out))))(edit)
                handles.append(module.register_forward_hook(this_threads(hook)))
        yield
    finally:
        for handle in handles:
            handle.remove()


# --- one clean and one corrupted batch ---

@dataclass
class Contrast:
    """A clean and a corrupted batch of sources (B, S), the clean answers read as decoder
    input (B, T), and what is scored: (b, t, clean token, corrupted token) where they differ."""

    clean: Tensor
    corrupt: Tensor
    decoder_input: Tensor
    scored: list[tuple[int, int, int, int]]

    def logit_diff(self, logits: Tensor) -> float:
        """LD summed over the scored positions: logits (B, T, V)."""
        return sum(float(logits[b, t, c] - logits[b, t, k]) for b, t, c, k in self.scored)


def contrast(model, task: Task, clean: list[list[int]], corrupt: list[list[int]]) -> Contrast:
    """The batch of `clean` and `corrupt` sources (pairwise of one length) and the positions
    where their greedy answers differ; refused when none do."""
    vocab, device = task.vocab, next(model.parameters()).device
    answers = predict(model, task, clean + corrupt, device)
    written = [[*answer, vocab.eos_id] for answer in answers]  # what each step writes
    clean_out, corrupt_out = written[:len(clean)], written[len(clean):]
    scored = [(b, t, c, k) for b, (ours, theirs) in enumerate(zip(clean_out, corrupt_out,
                                                                  strict=True))
              for t, (c, k) in enumerate(zip(ours, theirs)) if c != k]
    if not scored:
        raise MinitfmError("the clean and the corrupted input get the same answer, so there "
                           "is nothing to restore: give a --corrupt input whose answer differs")
    reads = [[vocab.bos_id, *out[:-1]] for out in clean_out]  # BOS + the clean answer
    return Contrast(padded(clean, vocab.pad_id, device), padded(corrupt, vocab.pad_id, device),
                    padded(reads, vocab.pad_id, device), scored)


def padded(rows: list[list[int]], pad_id: int, device) -> Tensor:
    """Token rows right-padded to one length: (B, longest)."""
    width = max(len(row) for row in rows)
    return torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], device=device)


@torch.no_grad()
def recorded(model, src: Tensor, tgt: Tensor):
    """The logits of one run, every head's output (kind, layer) -> (B, H, T_q, K) and the
    residual stream at every point (stream, layer) -> (B, T, D)."""
    heads, stream = {}, {}
    def keep(store, key):
        def edit(x: Tensor) -> Tensor:
            store[key] = x.clone()
            return x
        return edit
    head_edits = {key: keep(heads, key) for key in all_layers(model)}
    residual = {key: keep(stream, key) for key in residual_points(model)}
    with edited_heads(model, head_edits), residual_edits(model, residual):
        logits = model(src, tgt)
    # in the order of kinds (encoder, decoder, cross), as every view lists them, not in the
    # order the passes reach them (decoder L0, cross L0, decoder L1, ...)
    return logits, {key: heads[key] for key in head_edits}, stream


def all_layers(model) -> list[tuple[str, int]]:
    """Every attention layer as (kind, layer), in the model's order of kinds."""
    counts = layer_counts(model)
    return [(kind, layer) for kind in KINDS for layer in range(counts[kind])]


def head_patch(clean: Tensor, head: int) -> Edit:
    """Head `head`'s output (B, H, T_q, K) taken from the clean run's `clean`."""
    def edit(heads: Tensor) -> Tensor:
        patched = heads.clone()
        patched[:, head] = clean[:, head]
        return patched
    return edit


def position_patch(clean: Tensor, position: int) -> Edit:
    """The residual stream (B, T, D) at `position` taken from the clean run's `clean`."""
    def edit(x: Tensor) -> Tensor:
        patched = x.clone()
        patched[:, position] = clean[:, position]
        return patched
    return edit


@dataclass
class Patching:
    """What patching measured: LD of both runs, and the restored share of each activation."""

    clean_diff: float
    corrupt_diff: float
    heads: list[dict]  # {"kind", "layer", "head", "restored"}: kinds, layers, heads in order
    residual: list[dict]  # {"point", "stream", "layer", "position", "restored"}


@torch.no_grad()
def patch_activations(model, batch: Contrast, residual: bool = True) -> Patching:
    """The restored share of every head and (with `residual`) of the residual stream at every
    point and position, for one contrast."""
    with eval_mode(model):
        clean_logits, heads, stream = recorded(model, batch.clean, batch.decoder_input)
        clean_diff = batch.logit_diff(clean_logits)
        corrupt_diff = batch.logit_diff(model(batch.corrupt, batch.decoder_input))
        span = clean_diff - corrupt_diff

        def restored(logits: Tensor) -> float:
            return (batch.logit_diff(logits) - corrupt_diff) / span if span else 0.0

        head_rows = []
        for (kind, layer), clean in heads.items():
            for head in range(clean.size(1)):
                with edited_heads(model, {(kind, layer): head_patch(clean, head)}):
                    diff = batch.logit_diff(model(batch.corrupt, batch.decoder_input))
                head_rows.append({"kind": kind, "layer": layer, "head": head, "logit_diff": diff,
                                  "restored": (diff - corrupt_diff) / span if span else 0.0})
        stream_rows = []
        for (name, layer), clean in stream.items() if residual else ():
            point = point_name(name, layer, len(model.encoder_layers))
            for position in range(clean.size(1)):
                with residual_edits(model, {(name, layer): position_patch(clean, position)}):
                    share = restored(model(batch.corrupt, batch.decoder_input))
                stream_rows.append({"point": point, "stream": name, "layer": layer,
                                    "position": position, "restored": share})
    return Patching(clean_diff, corrupt_diff, head_rows, stream_rows)


def corruption(model, task: Task, src: list[int]) -> list[int]:
    """The default corrupted input of `src`: the first single-token change (by position, then
    by symbol) that the task accepts and that changes the model's answer."""
    device = next(model.parameters()).device
    answer = predict(model, task, [src], device)[0]
    symbols = range(len(SPECIAL_TOKENS), len(task.vocab))  # the task's symbols and the data's
    for position in range(len(src)):
        changed = [src[:position] + [s] + src[position + 1:] for s in symbols
                   if s != src[position] and accepts(task, src[:position] + [s] +
                                                     src[position + 1:])]
        answers = predict(model, task, changed, device) if changed else []
        for candidate, other in zip(changed, answers, strict=True):
            if other != answer:
                return candidate
    raise MinitfmError("no single-token change of the clean input changes the model's answer: "
                       "give --corrupt yourself")


def accepts(task: Task, src: list[int]) -> bool:
    """Whether `src` is an input the task takes (as `predict` would read it)."""
    try:
        task.parse(task.format(src))
    except MinitfmError:
        return False
    return True


# --- `minitfm patch` ---

@dataclass
class PatchReport:
    """What `minitfm patch` measured for one clean and one corrupted input."""

    task: str
    checkpoint: Path
    step: int
    clean: list[str]  # the tokens of each input and answer
    corrupt: list[str]
    clean_answer: list[str]
    corrupt_answer: list[str]
    positions: list[int]  # the output positions scored: where the answers differ
    patching: Patching
    png: Path | None = None
    warning: str | None = None  # an input longer than the lengths trained on

    @property
    def heads(self) -> list[dict]:
        return self.patching.heads

    def streams(self, side: str) -> list[tuple[str, list[float]]]:
        """Each residual point of one side ("encoder": source positions, "decoder": output
        positions), its name and its restored share at each position, in the model's order."""
        rows: dict[str, list[float]] = {}
        for row in self.patching.residual:
            if row["stream"] == side:
                rows.setdefault(row["point"], []).append(row["restored"])
        return list(rows.items())

    def source_labels(self) -> list[str]:
        """The encoder side's columns: position and source token, `clean/corrupted` where the
        inputs differ."""
        return [f"{i}: {either(c, k)}" for i, (c, k) in enumerate(zip(self.clean, self.corrupt,
                                                                       strict=True))]

    def output_labels(self) -> list[str]:
        """The decoder side's columns, as the explorer writes them: output position i reads the
        clean answer's token before it and writes its own (`3: 5→2`), `clean/corrupted` where
        the corrupted input's answer writes another token there."""
        written, theirs = [*self.clean_answer, EOS], [*self.corrupt_answer, EOS]
        reads = [BOS, *self.clean_answer]  # the decoder input of both runs
        return [f"{i}: {read}→{either(ours, theirs[i]) if i < len(theirs) else ours}"
                for i, (read, ours) in enumerate(zip(reads, written, strict=True))]

    def title(self) -> str:
        return (f"activation patching · {self.task} · {self.checkpoint.name} · step {self.step}"
                f" · clean {' '.join(self.clean)} → {' '.join(self.clean_answer)} · corrupted "
                f"{' '.join(self.corrupt)} → {' '.join(self.corrupt_answer)} · scored at output "
                f"positions {', '.join(map(str, self.positions))}")

    def as_dict(self) -> dict:
        """The `--json` object."""
        return {"checkpoint": str(self.checkpoint), "step": self.step,
                "clean": " ".join(self.clean), "corrupt": " ".join(self.corrupt),
                "clean_answer": " ".join(self.clean_answer),
                "corrupt_answer": " ".join(self.corrupt_answer), "positions": self.positions,
                "clean_logit_diff": self.patching.clean_diff,
                "corrupt_logit_diff": self.patching.corrupt_diff,
                "heads": [{k: v for k, v in row.items() if k != "logit_diff"}
                          for row in self.heads],
                "residual": self.patching.residual}


def either(clean: str, corrupt: str) -> str:
    """One token of both runs: `3` where they agree, `3/0` where the corrupted run's differs."""
    return clean if clean == corrupt else f"{clean}/{corrupt}"


def patch(loaded, options) -> PatchReport:
    """`minitfm patch`: patch every head and the residual stream at every position of one
    corrupted input from its clean run; write the heatmap PNG (see `PatchOptions`)."""
    from minitfm.lab.attention.probe import pick_probe
    from minitfm.lab.interpret.cards import patch_figure
    from minitfm.lab.pictures import check_output, check_picture_path, save_png

    named = loaded.picture_path("patch", f"step{loaded.step}.png")  # where the default goes
    if options.out is not None:  # checked before anything is decoded
        check_output(options.out, "--out", options.force)
    else:  # its folder: the name needs the inputs
        check_picture_path(named, "--out")
    model, task, cfg = loaded.model, loaded.task, loaded.config
    limit = input_limit(cfg, task)  # what the model has positions for
    clean = task.parse(options.clean, limit) if options.clean is not None else \
        pick_probe(loaded.held_out())[0]
    corrupt = task.parse(options.corrupt, limit) if options.corrupt is not None else \
        corruption(model, task, clean)
    if len(corrupt) != len(clean):
        raise MinitfmError(f"--corrupt has {len(corrupt)} tokens and --clean {len(clean)}: "
                           f"patching compares inputs of the same length")
    png = options.out if options.out is not None else \
        named.with_name(f"{named.stem}-{inputs_digest(task, clean, corrupt)}.png")
    check_output(png, "--out", options.force)
    batch = contrast(model, task, [clean], [corrupt])
    answers = predict(model, task, [clean, corrupt], loaded.device)
    tokens = [[task.vocab.token(i) for i in ids] for ids in (clean, corrupt, *answers)]
    report = PatchReport(loaded.config.task.name, loaded.checkpoint, loaded.step, *tokens,
                         sorted({t for _, t, _, _ in batch.scored}),
                         patch_activations(model, batch), png,
                         length_warning(cfg, task, [clean, corrupt], "input"))
    save_png(patch_figure(report), png, "--out", options.force)
    return report


def inputs_digest(task: Task, clean: list[int], corrupt: list[int]) -> str:
    """8 hex digits naming a pair of inputs (the sha256 of both as the task writes them): the
    default picture of each pair gets a file of its own, and the same pair the same file."""
    text = json.dumps([task.format(clean), task.format(corrupt)], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
