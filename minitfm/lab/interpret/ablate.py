"""Which heads does the model need? `minitfm ablate` switches heads off and measures the damage.

Every attention head of every kind (encoder self-attention, decoder self-attention,
cross-attention) and layer is switched off in turn, then every whole attention sub-layer (all
its heads at once), and each time the held-out set is decoded greedily as `minitfm eval` does
(with the KV cache). A switched-off head h outputs, instead of head_h = softmax(Q_h K_h^T /
sqrt(d_k)) V_h, before the heads are concatenated and projected by W^O (Vaswani et al. 2017,
§3.2.2):

- zero ablation (`mode="zero"`): 0;
- mean ablation (`mode="mean"`): the mean of head_h over every non-pad query position of the
  held-out set, from one teacher-forced pass of the intact model on the true targets (queries:
  the source tokens for encoder heads; BOS + the target tokens for decoder and cross heads).

A sub-layer with every head off still adds W^O times the replacement plus its bias: a constant,
which carries no information about the input. The drop of an ablation is the intact model's
exact match minus the ablated one, as fractions.

The model knows nothing of ablations: `edited_heads` attaches forward hooks to the hook point
`heads` of each `MultiHeadAttention` (its head outputs, before W^O) for the length of a block,
and removes them after, so the greedy decoding of `minitfm eval` runs unchanged underneath. A
hook edits only the passes of the thread that attached it: another thread running the same
model meanwhile (the Python API's `Run`, shared by a notebook's widgets) runs it intact.

Shapes: B batch, H n_heads, Q query len, K d_head, L layers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from minitfm.book.metrics import (
    EVAL_BATCH_SIZE,
    EvalResult,
    evaluate,
    length_chunks,
    predict,
    score,
)
from minitfm.book.model import eval_mode
from minitfm.errors import MinitfmError, option
from minitfm.lab.attention.probe import KIND_TITLES, KINDS
from minitfm.lab.loaded import Loaded
from minitfm.lab.options import MODES, AblateOptions
from minitfm.lab.pictures import check_output, save_png
from minitfm.run.limits import check_fits, decoding_parts
from minitfm.tasks.base import Batch, Pair, make_batch

MARKED_DROP = 0.10  # heads whose removal costs more than 10 points of exact match are marked


# --- editing the head outputs: forward hooks on the hook points ---

# A function of one layer's head outputs (B, H, Q, K), applied before the heads are
# concatenated and projected by W^O; it returns a tensor of the same shape. `HeadAblation`
# switches heads off; `HeadMeans.recorder` records their mean output.
HeadEdit = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class HeadAblation:
    """Heads of one attention layer switched off: each output head_h (before W^O) replaced.

    Zero ablation replaces head_h with 0, mean ablation with its mean over held-out data
    (the usual choice in interpretability work: the next layers see a vector of the usual scale).
    """

    off: Tensor  # (H,) bool, True = switched off
    value: Tensor  # (H, K): what a switched-off head outputs at every position

    def __call__(self, heads: Tensor) -> Tensor:
        off = self.off[:, None, None]  # (H, 1, 1)
        return torch.where(off, self.value[:, None, :], heads)  # (B, H, Q, K)


def hook_point(model, kind: str, layer: int) -> nn.Module:
    """The `heads` hook point of one attention layer: encoder, decoder or cross, by kind."""
    if kind == "encoder":
        return model.encoder_layers[layer].self_attn.heads
    if kind == "decoder":
        return model.decoder_layers[layer].self_attn.heads
    return model.decoder_layers[layer].cross_attn.heads  # "cross"


def this_threads(hook):
    """`hook` (a forward hook or pre-hook) acting on the passes of the thread that made it
    only: in another thread's pass it returns None, which leaves the values as they are (the
    Python API's `Run` may be shared by threads)."""
    owner = threading.get_ident()

    def guarded(*args):
        return hook(*args) if threading.get_ident() == owner else None
    return guarded


def forward_hook(edit: HeadEdit):
    """`edit` as a forward hook of this thread's passes: a hook that returns a tensor replaces
    the module's output, one that returns None leaves it (another thread's pass) as it is."""
    return this_threads(lambda _module, _inputs, heads: edit(heads))


@contextmanager
def attached(edits: dict[nn.Module, HeadEdit]) -> Iterator[None]:
    """Each edit hooked to its hook point for the block; every hook removed after, even if the
    block raises (a hook left behind would edit every later call of the model)."""
    handles = []
    try:
        for point, edit in edits.items():
            handles.append(point.register_forward_hook(forward_hook(edit)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def edited_heads(model, edits: dict[tuple[str, int], HeadEdit]):
    """`attached` for edits by (kind, layer): `with edited_heads(model, {("cross", 0): edit}):`."""
    return attached({hook_point(model, kind, layer): edit
                     for (kind, layer), edit in edits.items()})


# --- mean ablation: the mean output of every head ---

@dataclass
class HeadMeans:
    """Sums of every head's output over the non-pad queries it served, per (kind, layer)."""

    sums: dict[tuple[str, int], Tensor] = field(default_factory=dict)  # (H, K) each
    counts: dict[tuple[str, int], int] = field(default_factory=dict)

    def recorder(self, kind: str, layer: int, valid: Tensor) -> HeadEdit:
        """A HeadEdit that adds the outputs at the queries where `valid` (B, Q) to the sums;
        it returns the heads unchanged."""
        def record(heads: Tensor) -> Tensor:  # (B, H, Q, K)
            total = torch.einsum("bhqk,bq->hk", heads, valid.to(heads.dtype))  # (H, K)
            key = (kind, layer)
            self.sums[key] = self.sums.get(key, 0) + total
            self.counts[key] = self.counts.get(key, 0) + int(valid.sum())
            return heads
        return record

    def recorders(self, batch: Batch, pad_id: int,
                  n_layers: dict[str, int]) -> dict[tuple[str, int], HeadEdit]:
        """Recorders for every layer of one teacher-forced batch, by (kind, layer)."""
        src_valid, tgt_valid = batch.src != pad_id, batch.tgt_in != pad_id  # (B, S), (B, T)
        valid = {"encoder": src_valid, "decoder": tgt_valid, "cross": tgt_valid}
        return {(kind, i): self.recorder(kind, i, valid[kind])
                for kind in KINDS for i in range(n_layers[kind])}

    def means(self) -> dict[tuple[str, int], Tensor]:
        """The mean output (H, K) of every head, per (kind, layer)."""
        return {key: total / max(self.counts[key], 1) for key, total in self.sums.items()}


def layer_counts(model) -> dict[str, int]:
    """Attention layers per kind: decoder layers each have a self- and a cross-attention."""
    n_decoder = len(model.decoder_layers)
    return {"encoder": len(model.encoder_layers), "decoder": n_decoder, "cross": n_decoder}


@torch.no_grad()
def head_means(loaded: Loaded, pairs: list[Pair],
               batch_size: int = EVAL_BATCH_SIZE) -> dict[tuple[str, int], Tensor]:
    """Every head's mean output (H, K) over the non-pad queries of one teacher-forced pass."""
    model, vocab = loaded.model, loaded.task.vocab
    means, n_layers = HeadMeans(), layer_counts(model)
    with eval_mode(model):
        for chunk in length_chunks([len(src) for src, _ in pairs], batch_size):
            batch = make_batch([pairs[i] for i in chunk], vocab).to(loaded.device)
            with edited_heads(model, means.recorders(batch, vocab.pad_id, n_layers)):
                model(batch.src, batch.tgt_in)
    return means.means()


def replacements(loaded: Loaded, pairs: list[Pair], mode: str,
                 batch_size: int = EVAL_BATCH_SIZE) -> dict[tuple[str, int], Tensor]:
    """What a switched-off head outputs, (H, K) per (kind, layer): 0 or its mean."""
    if mode == "mean":
        return head_means(loaded, pairs, batch_size)
    cfg = loaded.model.config
    n_heads, d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
    return {(kind, i): torch.zeros(n_heads, d_head, device=loaded.device)
            for kind, n in layer_counts(loaded.model).items() for i in range(n)}


# --- the ablations ---

@dataclass
class AblationReport:
    """What `minitfm ablate` measured: the intact model, then one row per head and per layer."""

    task: str
    checkpoint: Path
    step: int
    mode: str
    baseline: EvalResult
    heads: list[dict]  # {"kind", "layer", "head", "exact_match", "drop"}
    layers: list[dict]  # {"kind", "layer", "exact_match", "drop"}
    png: Path | None = None

    def as_dict(self) -> dict:
        """The `--json` object."""
        return {"checkpoint": str(self.checkpoint), "step": self.step,
                "samples": self.baseline.total.count, "mode": self.mode,
                "baseline": {"exact_match": self.baseline.exact_match,
                             "token_accuracy": self.baseline.token_accuracy},
                "heads": self.heads, "layers": self.layers}


def ablated(loaded: Loaded, pairs: list[Pair], baseline: EvalResult,
            edits: dict[tuple[str, int], HeadAblation], options: AblateOptions) -> dict:
    """Exact match with `edits` (by kind and layer, see `edited_heads`), and its drop from
    `baseline`."""
    with edited_heads(loaded.model, edits):
        predictions = predict(loaded.model, loaded.task, [src for src, _ in pairs],
                              loaded.device, options.batch_size)
    total, _ = score(pairs, predictions)
    drop = (baseline.total.exact - total.exact) / max(total.count, 1)  # counts: no float noise
    return {"exact_match": total.exact_match, "drop": drop}


def ablate_all(loaded: Loaded, pairs: list[Pair], baseline: EvalResult,
               values: dict[tuple[str, int], Tensor], options: AblateOptions):
    """Every head switched off in turn, then every layer's heads at once: (heads, layers)."""
    heads, layers = [], []
    for kind, n in layer_counts(loaded.model).items():
        for layer in range(n):
            value = values[(kind, layer)]  # (H, K)
            off = torch.eye(value.size(0), dtype=torch.bool, device=value.device)  # (H, H)
            for head in range(value.size(0)):
                edits = {(kind, layer): HeadAblation(off[head], value)}
                heads.append({"kind": kind, "layer": layer, "head": head,
                              **ablated(loaded, pairs, baseline, edits, options)})
            edits = {(kind, layer): HeadAblation(off.any(dim=0), value)}
            layers.append({"kind": kind, "layer": layer,
                           **ablated(loaded, pairs, baseline, edits, options)})
    return heads, layers


def ablate_model(loaded: Loaded, pairs: list[Pair],
                 options: AblateOptions = AblateOptions()) -> tuple[EvalResult, list, list]:
    """The intact model's metrics (as `minitfm eval`), then every head and layer ablated."""
    check_mode(options.mode)
    baseline = evaluate(loaded.model, loaded.task, pairs, loaded.device, options.batch_size)
    values = replacements(loaded, pairs, options.mode, options.batch_size)
    return baseline, *ablate_all(loaded, pairs, baseline, values, options)


def check_mode(mode: str) -> None:
    """`--mode` (the API's `mode`): one of MODES."""
    if mode not in MODES:
        raise MinitfmError(f"{option('mode')} ({mode!r}) must be one of {', '.join(MODES)}")


def check_options(options: AblateOptions) -> None:
    """`--mode` and `--out` (the picture rule, `pictures.check_output`), refused before the
    checkpoint is read and seconds of decoding rather than after."""
    check_mode(options.mode)
    if options.out is not None:
        check_output(options.out, "--out", options.force)


def ablate(loaded: Loaded, options: AblateOptions = AblateOptions()) -> AblationReport:
    """`minitfm ablate`: ablate every head and layer of a loaded run; write the PNG (an
    existing one only if minitfm wrote it, or with `options.force`)."""
    check_options(options)
    cfg = loaded.config
    check_fits(decoding_parts(cfg, options.samples, cfg.task.max_len, options.batch_size),
               "evaluation")
    png = options.out if options.out is not None else \
        loaded.picture_path("ablate", f"step{loaded.step}-{options.mode}.png")
    check_output(png, "--out", options.force)  # the default path too, before the decoding
    pairs = loaded.ablation_pairs(options.samples)
    report = AblationReport(cfg.task.name, loaded.checkpoint, loaded.step, options.mode,
                            *ablate_model(loaded, pairs, options))
    report.png = png
    save_png(ablation_figure(report), report.png, "--out", options.force)
    return report


# --- tables and figure ---

def grid(report: AblationReport, kind: str) -> list[list[dict]]:
    """The rows of one kind: per layer, its heads in order, then the whole layer."""
    return [[row for row in report.heads if row["kind"] == kind and row["layer"] == layer["layer"]]
            + [layer] for layer in report.layers if layer["kind"] == kind]


def headline(report: AblationReport, checkpoint: str) -> str:
    """Task, checkpoint, step, mode, samples; the intact model's numbers on a second line."""
    base = report.baseline
    return (f"{report.task} · {checkpoint} · step {report.step} · {report.mode} ablation on "
            f"{base.total.count} held-out sequences\nintact: exact match {base.exact_match:.1%}, "
            f"token accuracy {base.token_accuracy:.1%}")


def ablation_figure(report: AblationReport):
    """Heatmaps of the drop, in points: per kind, rows layers, columns heads and the layer."""
    from matplotlib.figure import Figure

    grids = {kind: grid(report, kind) for kind in KINDS}
    n_cols = max(len(rows[0]) for rows in grids.values())
    heights = [0.5 * len(rows) + 0.9 for rows in grids.values()]  # + the block's title
    fig = Figure(figsize=(0.8 * n_cols + 2.6, sum(heights) + 0.9), dpi=100,
                 layout="constrained")
    fig.suptitle(headline(report, report.checkpoint.name) + "; cells: drop in points",
                 fontsize=9)
    subfigures = fig.subfigures(len(grids), 1, height_ratios=heights, squeeze=False)[:, 0]
    for subfigure, (kind, rows) in zip(subfigures, grids.items(), strict=True):
        draw_drops(subfigure, kind, rows)
    return fig


def draw_drops(subfigure, kind: str, rows: list[list[dict]]) -> None:
    """One kind's drops as a heatmap with the value in each cell; one scale for every kind."""
    drops = 100 * np.array([[cell["drop"] for cell in row] for row in rows])  # (L, H + 1)
    ax = subfigure.subplots()
    subfigure.suptitle(KIND_TITLES[kind], fontsize=9)
    image = ax.imshow(drops, cmap="Reds", vmin=0.0, vmax=100.0, aspect="auto")
    for (r, c), value in np.ndenumerate(drops):
        ax.text(c, r, f"{value:.1f}", ha="center", va="center", fontsize=8,
                color="white" if value > 60 else "black")
    ax.axvline(drops.shape[1] - 1.5, color="black", linewidth=2)  # heads | whole layer
    ax.set_xticks(range(drops.shape[1]),
                  [f"head {h}" for h in range(drops.shape[1] - 1)] + ["all heads"], fontsize=8)
    ax.set_yticks(range(drops.shape[0]), [f"layer {layer}" for layer in range(len(rows))],
                  fontsize=8)
    ax.tick_params(length=0)
    subfigure.colorbar(image, ax=ax, label="drop (points)", pad=0.01)


# --- heads switched off by name: Run.predict(heads_off=...) and `minitfm explore` ---

def check_heads(model, heads_off) -> list[tuple[str, int, int]]:
    """`heads_off` as (kind, layer, head) triples, each naming a head the model has (None:
    none)."""
    n_layers, n_heads = layer_counts(model), model.config.n_heads
    checked = []
    for item in () if heads_off is None else heads_off:
        if not (isinstance(item, (tuple, list)) and len(item) == 3):
            raise MinitfmError(f"heads_off item ({item!r}) must be (kind, layer, head), "
                               f"e.g. ('cross', 0, 1)")
        kind, layer, head = item
        if kind not in KINDS:
            raise MinitfmError(f"heads_off kind ({kind!r}) must be one of {', '.join(KINDS)}")
        for name, value, count in (("layer", layer, n_layers[kind]), ("head", head, n_heads)):
            if type(value) is not int or not 0 <= value < count:
                raise MinitfmError(f"heads_off {name} ({value!r}) must be 0..{count - 1} "
                                   f"for {kind}")
        checked.append((kind, layer, head))
    return checked


def switched_off(loaded: Loaded, heads_off,
                 mode: str = "zero") -> dict[tuple[str, int], HeadAblation]:
    """The edits that switch `heads_off` ((kind, layer, head) triples) off, as `ablate` does
    (zero, or the mean over `loaded.ablation_pairs()`), by (kind, layer):
    `with edited_heads(loaded.model, edits):`."""
    check_mode(mode)
    heads = check_heads(loaded.model, heads_off)
    if not heads:
        return {}
    pairs = loaded.ablation_pairs() if mode == "mean" else []
    return heads_edits(replacements(loaded, pairs, mode), heads)


def heads_edits(values: dict[tuple[str, int], Tensor],
                heads: list[tuple[str, int, int]]) -> dict[tuple[str, int], HeadAblation]:
    """The edits that switch `heads` ((kind, layer, head) triples) off, each with its layer's
    replacement `values` (see `replacements`), by (kind, layer)."""
    edits = {}
    for kind, layer, head in heads:
        value = values[(kind, layer)]  # (H, K)
        off = edits[(kind, layer)].off.clone() if (kind, layer) in edits else \
            torch.zeros(value.size(0), dtype=torch.bool, device=value.device)  # (H,)
        off[head] = True
        edits[(kind, layer)] = HeadAblation(off, value)
    return edits
