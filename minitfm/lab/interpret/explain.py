"""What each head does, proven by cause: `minitfm explain` writes a role card for every head.

A card joins three measurements of one head, all on held-out data:

- its **pattern** (`patterns`): the family's pattern it fits best, with its alignment score;
- its **effect**: the exact-match drop when it alone is switched off, in zero and in mean
  ablation (`ablate`'s two modes), with a 95% interval: each held-out row is right or wrong with
  and without the head, and the drop is the mean of the paired differences, so the interval is
  mean +- 1.96 standard errors of those differences (a normal interval, fine for the 1,000 rows
  `explain` decodes);
- its **patching share** (`patching`): how much of the clean answer it restores when its output
  is patched from a clean run into a corrupted one. The corruption family is *resampling*: each
  clean held-out input is paired with the next held-out input of the same length whose answer
  differs (any task, any data: the corrupted input is always one the task takes).

Its **role** says both in words: "cross L1 H2 reads the mirrored position (n-1-i); without it
exact match falls 75 points". A head is *essential* when switching it off alone costs at least
10 points, in either mode; it *helps* above 1 point. The heads at or under 1 point are called
*negligible* only as a group that is checked: all of them switched off at once must cost at most
1 point in both modes; while they cost more, the one that costs most alone leaves the group
(it is then *minor*: small alone, not negligible with the others off). A head that matters but
fits no pattern of the family is called by its effect, "pattern unclear", never diffuse.

Beside its PNG, `explain` writes the same report as JSON, with each layer's mean attention maps
and a digest of the weights it measured: `minitfm explore` embeds the cards from it when it is
of the page's checkpoint (explorer_records.role_cards), as a page cannot redo 1,000-row
ablations. The JSON is replaced, as the PNG, only when minitfm wrote it, or with --force.

Shapes: H n_heads, T_q and T_k query and key len.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from minitfm.book.metrics import EVAL_BATCH_SIZE, length_chunks, predict
from minitfm.book.model import eval_mode
from minitfm.errors import MinitfmError, shown_path
from minitfm.lab.attention.probe import pick_probe
from minitfm.lab.interpret.ablate import edited_heads, heads_edits, replacements
from minitfm.lab.interpret.lens import logit_lens
from minitfm.lab.interpret.patching import contrast, patch_activations
from minitfm.lab.interpret.patterns import HeadPattern, head_patterns, mean_maps
from minitfm.lab.loaded import Loaded
from minitfm.lab.options import ExplainOptions
from minitfm.lab.pictures import check_output, save_png
from minitfm.run.files import to_json, write_atomic
from minitfm.run.rundir import open_run_file
from minitfm.tasks.base import Pair, make_batch

SURE = 1e-3  # a teacher-forced verdict closer than this to a tie is decoded instead (`correct`)
ESSENTIAL = 0.10  # switched off alone, an essential head costs at least 10 points
NEGLIGIBLE = 0.01  # negligible heads cost at most 1 point, all of them off at once
PATCHED_PAIRS = 200  # clean held-out inputs (each with its resampled corruption) for patching
PATTERN_PAIRS = 500  # held-out pairs the patterns are scored on
MODES = ("zero", "mean")
EFFECT_NAMES = ("essential", "helps", "minor", "negligible")
CARDS_MARK = "minitfm explain"  # the "generator" of the JSON beside the role cards' PNG


@dataclass
class Drop:
    """An exact-match drop with its 95% interval, from paired right/wrong rows."""

    value: float
    low: float
    high: float

    @classmethod
    def paired(cls, before: list[bool], after: list[bool]) -> Drop:
        """The mean of before - after (1 right, 0 wrong) +- 1.96 standard errors."""
        n = len(before)
        diffs = [int(b) - int(a) for b, a in zip(before, after, strict=True)]
        mean = sum(diffs) / n
        var = sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1)
        half = 1.96 * math.sqrt(var / n)
        return cls(mean, mean - half, mean + half)


@dataclass
class Card:
    """One head's role card."""

    pattern: HeadPattern
    drops: dict[str, Drop]  # by mode
    restored: float  # the patching share
    effect: str = ""  # essential, helps, minor or negligible
    sentence: str = ""  # the role after the head's label

    @property
    def label(self) -> str:
        return f"{self.pattern.kind} L{self.pattern.layer} H{self.pattern.head}"

    @property
    def role(self) -> str:
        return f"{self.label} {self.sentence}"

    @property
    def drop(self) -> tuple[float, str]:
        """The larger drop and its mode."""
        return max((self.drops[mode].value, mode) for mode in MODES)

    def as_dict(self) -> dict:
        p = self.pattern
        return {"kind": p.kind, "layer": p.layer, "head": p.head, "pattern": p.pattern,
                "best_fit": p.best_fit, "pattern_score": p.score, "pattern_rows": p.rows,
                **{f"drop_{mode}": self.drops[mode].value for mode in MODES},
                **{f"drop_{mode}_ci": [self.drops[mode].low, self.drops[mode].high]
                   for mode in MODES},
                "restored": self.restored, "effect": self.effect, "role": self.role}


@dataclass
class ExplainReport:
    """What `minitfm explain` found: a card per head, and the negligible heads' joint check."""

    task: str
    checkpoint: Path
    step: int
    samples: int
    exact_match: float
    cards: list[Card]
    negligible_together: dict[str, float]  # by mode: the drop with every negligible head off
    lens: dict = field(default_factory=dict)  # the logit lens of one held-out input
    png: Path | None = None

    def as_dict(self) -> dict:
        """The `--json` object."""
        return {"checkpoint": str(self.checkpoint), "step": self.step, "samples": self.samples,
                "exact_match": self.exact_match, "heads": [c.as_dict() for c in self.cards],
                "negligible_together": max(self.negligible_together.values(), default=0.0),
                "negligible_together_by_mode": self.negligible_together,
                "corruption": "resample", "patched_pairs": min(PATCHED_PAIRS, self.samples),
                "logit_lens": self.lens}


# --- effect: drops with their intervals ---

@torch.no_grad()
def correct(loaded: Loaded, pairs: list[Pair], edits=None) -> list[bool]:
    """Whether greedy decoding gets each pair exactly right, with `edits` (see
    `edited_heads`) in place: `predict`'s verdicts, from one teacher-forced pass.

    Greedy decoding writes the target exactly when, teacher-forced on it, each step's
    strongest logit is the target's token, EOS last: up to its first miss the decoder reads
    what it wrote itself. So one pass decides a row, where decoding takes a pass per token. A
    verdict that rests on a margin under SURE (a near tie, which the rounding of the
    step-by-step pass could turn) is decoded as `predict` does."""
    model, vocab = loaded.model, loaded.task.vocab
    verdicts: list[bool | None] = [None] * len(pairs)
    with edited_heads(model, edits or {}), eval_mode(model):
        for chunk in length_chunks([len(src) for src, _ in pairs], EVAL_BATCH_SIZE):
            batch = make_batch([pairs[i] for i in chunk], vocab).to(loaded.device)
            margin = target_margins(model(batch.src, batch.tgt_in), batch.tgt_out)  # (B, T)
            low = (margin < SURE) & (batch.tgt_out != vocab.pad_id)  # missed, or too close
            first = margin.gather(1, low.int().argmax(1, keepdim=True))[:, 0]  # (B,)
            for i, unsure, m in zip(chunk, low.any(1).tolist(), first.tolist(), strict=True):
                verdicts[i] = True if not unsure else False if m <= -SURE else None
        close = [i for i, verdict in enumerate(verdicts) if verdict is None]
        decoded = predict(model, loaded.task, [pairs[i][0] for i in close], loaded.device) \
            if close else []
    for i, output in zip(close, decoded, strict=True):
        verdicts[i] = output == pairs[i][1]
    return verdicts


def target_margins(logits: Tensor, targets: Tensor) -> Tensor:
    """Each step's logit of its target token minus the largest other logit (B, T): above 0
    where the target is the argmax; logits (B, T, V), targets (B, T)."""
    logits = logits.float()
    index = targets.clamp(min=0)[..., None]  # (B, T, 1)
    others = logits.scatter(-1, index, float("-inf")).amax(-1)  # (B, T)
    return logits.gather(-1, index)[..., 0] - others


def switched(values: dict, heads: list[HeadPattern]) -> dict:
    """The edits that switch `heads` off, each with its layer's replacement `values`."""
    return heads_edits(values, [(p.kind, p.layer, p.head) for p in heads])


def negligible(loaded: Loaded, pairs: list[Pair], base: list[bool], cards: list[Card],
               values: dict) -> tuple[list[Card], dict[str, float]]:
    """The heads negligible together, and their joint drop by mode (see the module docstring)."""
    group = sorted((c for c in cards if c.drop[0] <= NEGLIGIBLE), key=lambda c: c.drop)
    while group:
        together = {mode: Drop.paired(base, correct(
            loaded, pairs, switched(values[mode], [c.pattern for c in group]))).value
            for mode in MODES}
        if max(together.values()) <= NEGLIGIBLE:
            return group, together
        group = group[:-1]  # the one that costs most alone leaves
    return [], {}


# --- roles ---

def role(card: Card, negligible_note: str) -> tuple[str, str]:
    """The effect's name and the role in words (after the head's label)."""
    drop, mode = card.drop
    pattern = card.pattern
    if pattern.pattern == "diffuse" and drop > NEGLIGIBLE:
        pattern.pattern = "unclear"  # a head that matters is never waved away as diffuse
    falls = f"without it exact match falls {100 * drop:.0f} points ({mode} ablation)"
    if drop >= ESSENTIAL:
        effect = "essential"
    elif drop > NEGLIGIBLE:
        effect = "helps"
    else:
        effect = "negligible" if negligible_note else "minor"
    does = pattern.phrase if pattern.pattern != "unclear" else f"{effect}, pattern unclear"
    if effect in ("essential", "helps"):
        return effect, f"{does}; {falls}"
    if effect == "minor":
        return effect, (f"{does}; alone it costs {100 * drop:.1f} points, but it is not "
                        f"negligible with the other small heads off")
    return effect, f"{does}; negligible ({negligible_note})"


# --- the whole explanation ---

def resampled(loaded: Loaded, pairs: list[Pair]) -> tuple[list, list]:
    """Clean sources and their corruptions: the next held-out source of the same length whose
    answer differs (pairs with none are left out)."""
    by_length: dict[int, list[Pair]] = {}
    for pair in pairs:
        by_length.setdefault(len(pair[0]), []).append(pair)
    clean, corrupt = [], []
    for src, tgt in pairs[:PATCHED_PAIRS]:
        group = by_length[len(src)]
        start = group.index((src, tgt))
        for other, other_tgt in group[start + 1:] + group[:start]:
            if other_tgt != tgt:
                clean.append(src)
                corrupt.append(other)
                break
    return clean, corrupt


def patching_shares(loaded: Loaded, pairs: list[Pair]) -> dict[tuple[str, int, int], float]:
    """Each head's restored share, pooled over the resampled pairs, one length at a time."""
    clean, corrupt = resampled(loaded, pairs)
    sums: dict[tuple[str, int, int], float] = {}
    span = 0.0
    for n in sorted({len(src) for src in clean}):
        rows = [i for i, src in enumerate(clean) if len(src) == n]
        try:
            batch = contrast(loaded.model, loaded.task, [clean[i] for i in rows],
                             [corrupt[i] for i in rows])
        except MinitfmError:  # the model answers both alike: nothing to restore at this length
            continue
        result = patch_activations(loaded.model, batch, residual=False)
        span += result.clean_diff - result.corrupt_diff
        for row in result.heads:
            key = (row["kind"], row["layer"], row["head"])
            sums[key] = sums.get(key, 0.0) + row["logit_diff"] - result.corrupt_diff
    return {key: total / span if span else 0.0 for key, total in sums.items()}


def explain(loaded: Loaded, options: ExplainOptions = ExplainOptions()) -> ExplainReport:
    """`minitfm explain`: a role card for every head of a loaded run; write the PNG and,
    beside it, the JSON the explorer's page embeds."""
    name = f"step{loaded.step}.png"  # <checkpoint>-step<N>.png, in --out as in <run>/explain/
    if options.out is not None and options.out.suffix.lower() in (".png", ".json"):
        raise MinitfmError(f"--out ({shown_path(options.out)}) names a folder: explain writes two "
                           f"files there, its PNG and the JSON the explorer embeds, named after "
                           f"the checkpoint; give a folder, e.g. --out "
                           f"{shown_path(options.out.with_suffix(''))}")
    png = options.out / f"{loaded.checkpoint.stem}-{name}" if options.out is not None else \
        loaded.picture_path("explain", name)
    check_output(png, "--out", options.force)
    check_cards_json(png.with_suffix(".json"), options.force)
    pairs = loaded.ablation_pairs(options.samples)
    base = correct(loaded, pairs)
    values = {mode: replacements(loaded, pairs, mode) for mode in MODES}
    shares = patching_shares(loaded, pairs)
    cards = []
    for pattern in head_patterns(loaded.model, loaded.task, pairs[:PATTERN_PAIRS]):
        drops = {mode: Drop.paired(base, correct(loaded, pairs, switched(values[mode],
                                                                        [pattern])))
                 for mode in MODES}
        cards.append(Card(pattern, drops, shares.get((pattern.kind, pattern.layer,
                                                      pattern.head), 0.0)))
    group, together = negligible(loaded, pairs, base, cards, values)
    note = (f"with all {len(group)} negligible heads off at once, exact match falls "
            f"{100 * max(together.values(), default=0.0):.1f} points")
    for card in cards:
        card.effect, card.sentence = role(card, note if card in group else "")
    probe = pick_probe(pairs)[0]
    report = ExplainReport(loaded.config.task.name, loaded.checkpoint, loaded.step, len(pairs),
                           sum(base) / len(base), cards, together,
                           logit_lens(loaded.model, loaded.task, probe), png)
    from minitfm.lab.interpret.cards import cards_figure

    maps = mean_maps(loaded.model, loaded.task, pairs[:PATTERN_PAIRS])
    save_png(cards_figure(report, maps), png, "--out", options.force)
    write_cards_json(report, maps, weights_digest(loaded.model), png.with_suffix(".json"))
    return report


# --- the JSON beside the PNG, for the explorer's page ---

def weights_digest(model) -> str:
    """The first 16 hex digits of the sha256 of the model's weights (float32, state-dict
    order): which weights a report measured."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def is_cards_json(path: Path) -> bool:
    """Whether `path` is a role cards' JSON that minitfm wrote (it opens with CARDS_MARK)."""
    try:
        with open_run_file(path) as f:  # a link or a FIFO is not ours
            head = f.read(64)
    except OSError:
        return False
    return head.startswith(f'{{"generator": "{CARDS_MARK}"'.encode())


def check_cards_json(path: Path, force: bool) -> None:
    """The picture rule for the JSON beside the PNG: an existing file only if minitfm wrote
    it, or with --force."""
    if (path.exists() or path.is_symlink()) and not force and not is_cards_json(path):
        raise MinitfmError(f"'{path}' exists and is not a role cards' JSON minitfm wrote: "
                           f"choose another --out, or pass --force to replace it")


def write_cards_json(report: ExplainReport, maps: dict, digest: str, path: Path) -> None:
    """The report as `--json` prints it, with the task, the weights' digest and each layer's
    mean maps "kind.layer" -> (H, T_q, T_k), rounded to 4 digits."""
    document = {"generator": CARDS_MARK, "task": report.task, "weights": digest,
                **report.as_dict(),
                "maps": {f"{kind}.{layer}": torch.round(value, decimals=4).tolist()
                         for (kind, layer), value in maps.items()}}
    try:
        write_atomic(path, (to_json(document) + "\n").encode("utf-8"))
    except OSError as err:
        raise MinitfmError(f"cannot write '{path}' ({err.strerror or err}): choose another "
                           f"--out") from None
