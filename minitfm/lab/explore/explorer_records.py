"""What the explorer's page embeds from a run's records: attention over training
(attention.jsonl), the curves (metrics.jsonl), the last saved evaluation (eval-A-B.json), the
pictures of `minitfm ablate`, and the role cards of `minitfm explain`.

Each is read the one careful way (`files.open_run_file`: no links, regular files only, a bounded
read), and a record that is missing, damaged or of other weights is left out: the page then says
which command makes it. The role cards are embedded, never computed for the page: each head's
drops need 1,000-row ablations, which `minitfm explain` runs (about 15 s on the default run) and
writes beside its PNG (`<run>/explain/<checkpoint>-step<N>.json`); `explore` itself stays quick.
Only the cards of the page's own weights are taken (the JSON holds their digest).

Shapes: N snapshots, L layers, H n_heads, T_q and T_k query and key len.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np

from minitfm.errors import CheckpointError
from minitfm.lab.attention.probe import KINDS
from minitfm.lab.attention.timeline import read_timeline
from minitfm.lab.curves import is_number, read_eval, run_curves
from minitfm.lab.interpret.explain import CARDS_MARK, EFFECT_NAMES, weights_digest
from minitfm.lab.loaded import Loaded
from minitfm.run.rundir import open_run_file

MAX_SNAPSHOTS = 60  # attention.jsonl records kept (evenly spread, the last one always)
MAX_TRAIN_POINTS = 400  # loss curve points kept (evenly spread)
MAX_ABLATION_PNG_BYTES = 400_000  # an ablation picture larger than this is left out
MAX_CARDS_BYTES = 5_000_000  # a role cards' JSON larger than this is left out
MAX_TEXT = 400  # characters of a role sentence or a pattern's name
MAP_DIGITS = 3  # a mean attention weight in the page: 0.123


def timeline(run_dir: Path | None) -> dict | None:
    """attention.jsonl's snapshots (at most MAX_SNAPSHOTS), or None when it has none."""
    if run_dir is None:
        return None
    try:
        found = read_timeline(run_dir)
    except CheckpointError:
        return None
    keep = spread(len(found.steps), MAX_SNAPSHOTS)
    return {"input": found.input, "target": found.target, "source": found.source,
            "decoder_input": found.decoder_input,
            "steps": [found.steps[i] for i in keep],
            "exact_match": [found.exact_match[i] for i in keep],
            "alignment": None if found.alignment is None
            else np.round(found.alignment[keep], 4).tolist(),
            "cross": np.round(found.cross[keep].astype(np.float64), 3).tolist()}


def spread(n: int, most: int) -> list[int]:
    """At most `most` indices of range(n), evenly spread, the first and the last kept."""
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def curves(run_dir: Path | None) -> dict | None:
    """Loss and exact match against step, and the gauges' readings (step, exact, token
    accuracy, alignment, the forecast's words), from metrics.jsonl (None: no metrics)."""
    if run_dir is None:
        return None
    try:
        found = run_curves(run_dir)
    except (CheckpointError, OSError):
        return None
    train = [[r["step"], r["loss"]] for r in found["train"] if "loss" in r]
    return {"train": [train[i] for i in spread(len(train), MAX_TRAIN_POINTS)],
            "eval": [[r["step"], r.get("loss"), r.get("exact_match")] for r in found["eval"]],
            "gauges": [[r["step"], r["exact"], r["token_accuracy"], finite_or_none(r.get("align")),
                        forecast_text(r.get("forecast"))] for r in found["gauges"]]}


def finite_or_none(value) -> float | None:
    """A finite number as it is, anything else as None (a damaged or hand-made line)."""
    return value if is_number(value) and math.isfinite(value) else None


def forecast_text(forecast) -> str | None:
    """The words of a reading's forecast (at most MAX_TEXT characters), if it made one."""
    text = forecast.get("text") if isinstance(forecast, dict) else None
    return text[:MAX_TEXT] if isinstance(text, str) else None


def last_eval(run_dir: Path | None) -> dict | None:
    """Exact match per length of the newest eval report saved in the run (`eval-A-B.json`,
    written by `minitfm sweep`), or None."""
    if run_dir is None:
        return None
    for path in sorted(run_dir.glob("eval-*-*.json"), key=lambda p: p.lstat().st_mtime,
                       reverse=True):
        report = read_eval(path)  # None: damaged, or no regular file (a FIFO would hang)
        if report is not None:
            rows = {str(int(n)): [row["exact_match"], row["count"]]
                    for n, row in report["per_length"].items()}
            return {"file": path.name, "per_length": rows}
    return None


def ablation_pictures(run_dir: Path | None) -> list[dict]:
    """The run's `minitfm ablate` pictures (<run>/ablate/*.png) as base64, newest first."""
    if run_dir is None or not (run_dir / "ablate").is_dir():
        return []
    pictures = []
    for path in sorted((run_dir / "ablate").glob("*.png"), key=lambda p: p.lstat().st_mtime,
                       reverse=True)[:2]:
        try:
            with open_run_file(path) as f:  # a link or a FIFO is left out (see run.files)
                data = f.read(MAX_ABLATION_PNG_BYTES + 1)
        except OSError:
            continue
        if data.startswith(b"\x89PNG") and len(data) <= MAX_ABLATION_PNG_BYTES:
            pictures.append({"name": path.name,
                             "png": base64.b64encode(data).decode("ascii")})
    return pictures



# --- the role cards of `minitfm explain` ---

def role_cards(loaded: Loaded) -> dict | None:
    """The cards `minitfm explain` wrote for this checkpoint (None: it has not been run), or
    {"file", "problem"} when its JSON cannot be used (damaged, or of other weights)."""
    path = loaded.picture_path("explain", f"step{loaded.step}.json")
    try:
        with open_run_file(path) as f:  # a link or a FIFO is left out (see run.files)
            text = f.read(MAX_CARDS_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        return {"file": path.name, "problem": f"cannot be read ({err.strerror or err})"}
    try:
        if len(text) > MAX_CARDS_BYTES:
            raise ValueError(f"larger than {MAX_CARDS_BYTES:,} bytes")
        report = json.loads(text, parse_constant=refuse)
        if not isinstance(report, dict) or report.get("generator") != CARDS_MARK:
            raise ValueError("not a role cards' JSON minitfm wrote")
        if report.get("weights") != weights_digest(loaded.model):
            return {"file": path.name, "problem": "measured other weights (the run was "
                    "trained further or made again since)"}
        return {"file": path.name, **cards_of(report, loaded.model)}
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as err:
        return {"file": path.name, "problem": f"damaged ({err})"}


def refuse(constant: str):
    """NaN and Infinity, which minitfm never writes (files.to_json): a damaged file."""
    raise ValueError(f"{constant} is no JSON number")


def cards_of(report: dict, model) -> dict:
    """What the page shows of a report, checked field by field (ValueError: damaged)."""
    cfg = model.config
    layers = {"encoder": cfg.n_encoder_layers, "decoder": cfg.n_decoder_layers,
              "cross": cfg.n_decoder_layers}
    heads = [card_of(row, layers, cfg.n_heads) for row in report["heads"]]
    if sorted((h["kind"], h["layer"], h["head"]) for h in heads) != sorted(
            (kind, layer, head) for kind in KINDS for layer in range(layers[kind])
            for head in range(cfg.n_heads)):
        raise ValueError("not one card per head of this model")
    maps = {f"{kind}.{layer}": mean_map(report["maps"][f"{kind}.{layer}"], cfg.n_heads)
            for kind in KINDS for layer in range(layers[kind])}
    return {"step": integer(report["step"]), "samples": integer(report["samples"]),
            "exact_match": number(report["exact_match"], 0, 1),
            "negligible_together": number(report["negligible_together"], -1, 1),
            "patched_pairs": integer(report["patched_pairs"]),
            "corruption": text(report["corruption"]), "heads": heads, "maps": maps}


def card_of(row: dict, layers: dict, n_heads: int) -> dict:
    """One head's card, its fields checked."""
    kind = row["kind"]
    if kind not in KINDS or not 0 <= integer(row["layer"]) < layers[kind] or \
            not 0 <= integer(row["head"]) < n_heads:
        raise ValueError(f"no head {kind} {row['layer']} {row['head']} in this model")
    if row["effect"] not in EFFECT_NAMES:
        raise ValueError(f"effect {row['effect']!r}")
    card = {"kind": kind, "layer": row["layer"], "head": row["head"], "effect": row["effect"],
            **{key: text(row[key]) for key in ("pattern", "best_fit", "role")},
            **{key: number(row[key], 0, 1) for key in ("pattern_score", "pattern_rows")},
            **{key: number(row[key], -1, 1) for key in ("drop_zero", "drop_mean")},
            "restored": number(row["restored"], -math.inf, math.inf)}
    for key in ("drop_zero_ci", "drop_mean_ci"):
        low, high = row[key]
        card[key] = [number(low, -2, 2), number(high, -2, 2)]
    return card


def mean_map(value, n_heads: int) -> list:
    """One layer's mean maps (H, T_q, T_k) of weights in 0..1, rounded to MAP_DIGITS."""
    array = np.asarray(value, dtype=np.float64)  # ragged or not numbers: ValueError
    if array.ndim != 3 or array.shape[0] != n_heads or not 0 < array.shape[1] <= 1000 or \
            not 0 < array.shape[2] <= 1000 or not np.all((array >= 0) & (array <= 1)):
        raise ValueError("a mean map that is no (heads, queries, keys) array of weights")
    return np.round(array, MAP_DIGITS).tolist()


def integer(value) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{value!r} is no count")
    return value


def number(value, low: float, high: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{value!r} is no number in {low}..{high}")
    return value


def text(value) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{value!r:.60} is no short text")
    return value
