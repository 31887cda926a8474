"""`minitfm explore`: a trained run in one self-contained, offline HTML page.

The page runs the model itself: `explore/model.js` is the forward pass of book/model.py in
JavaScript, `explore/task.js` reads typed input as `minitfm predict` does, `explore/page.js`
draws the page. This module gathers what they need from the run (the weights, the head means
`minitfm ablate` uses, held-out examples, metrics.jsonl, attention.jsonl, the ablation
pictures) into one JSON document and inlines it with the scripts and the style sheet.

Everything from the run is data, never markup: the JSON sits in a `<script
type="application/json">` with `<`, `>`, `&` and U+2028/9 escaped, the page shows it with
`textContent`, and a Content-Security-Policy lets only the page's own scripts run (by their
SHA-256) and nothing load from anywhere: no fonts, no CDN, no fetch. A page is made to be
shared: the JSON is strict (a number that is not finite is null, drawn as a gap), it names files
without their folders, and the page decodes inputs of at most PAGE_MAX_TOKENS tokens, so that a
link cannot freeze the tab of whoever opens it. The page is written by the picture rule
(`pictures.check_output`): a file minitfm did not write is replaced only with --force.

Shapes: L layers, H n_heads, K d_head, V vocab_size, N snapshots, T_q and T_k query and key len.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import math
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from minitfm import __version__
from minitfm.book.metrics import predict
from minitfm.catalog import SPECIAL_TOKENS, TASKS
from minitfm.errors import CheckpointError, MinitfmError
from minitfm.lab.curves import read_eval, run_curves
from minitfm.lab.loaded import Loaded
from minitfm.lab.look.ablate import replacements
from minitfm.lab.look.probe import ALIGNMENT_SAMPLES, alignment_scores
from minitfm.lab.look.timeline import read_timeline
from minitfm.lab.measure.evaluate import input_limit
from minitfm.lab.pictures import GAMMA, PAGE_MARK, PAGE_SUFFIXES, PALETTE, check_output
from minitfm.run.files import open_run_file, to_json, write_atomic
from minitfm.tasks.base import Task

PAGE_NAME = "explorer.html"
SCRIPTS = ("task.js", "model.js", "page.js")  # in this order: page.js uses the other two
HELD_OUT_EXAMPLES = 200  # decoded live in the page when heads are switched off
MAX_SNAPSHOTS = 60  # attention.jsonl records kept (evenly spread, the last one always)
MAX_TRAIN_POINTS = 400  # loss curve points kept (evenly spread)
MAX_ABLATION_PNG_BYTES = 400_000  # an ablation picture larger than this is left out
CAP_TABLE = 8  # decoding caps tabulated for sources of 0..8 tokens, then extended linearly
# The longest input the page decodes (fewer where the positions end): at the default model size
# about a second a keystroke; 1,000 tokens took ten, and a page keeps every map it draws.
PAGE_MAX_TOKENS = 200
PAGE_WARN_BYTES = 50_000_000  # a larger page opens slowly in a browser, if at all
BYTES_PER_WEIGHT = 16 / 3  # a float32 in base64


@dataclass
class ExplorerPage:
    """What `write_explorer` wrote: the file, its size in bytes, the seconds it took."""

    path: Path
    size: int
    seconds: float


def write_explorer(loaded: Loaded, out: Path | None = None,
                   force: bool = False) -> ExplorerPage:
    """`minitfm explore`: write a loaded run's page (default `<run>/explorer.html`; a file there
    that minitfm did not write only with `force`)."""
    start = time.perf_counter()
    out = Path(out) if out is not None else default_path(loaded)
    check_page_path(out, force)
    data = page_data(loaded)
    html = render(data).encode("utf-8")
    try:
        write_atomic(out, html)
    except OSError as err:
        raise MinitfmError(f"cannot write '{out}' ({err.strerror}): choose another --out") \
            from None
    return ExplorerPage(out, len(html), time.perf_counter() - start)


def check_page_path(out: Path, force: bool = False) -> None:
    """`--out` names an HTML file that may be written, by the picture rule."""
    check_output(Path(out), "--out", force, PAGE_SUFFIXES)


def size_warning(loaded: Loaded) -> str | None:
    """A line when the page will be larger than PAGE_WARN_BYTES: its weights in base64 and
    about 0.2 MB besides (docs/explore.md)."""
    weights = sum(p.numel() for p in loaded.model.parameters())
    size = weights * BYTES_PER_WEIGHT + 200_000
    if size <= PAGE_WARN_BYTES:
        return None
    return (f"the page will be about {size / 1e6:,.1f} MB ({weights:,} weights at "
            f"{BYTES_PER_WEIGHT:.1f} bytes each): a browser opens a page over "
            f"{PAGE_WARN_BYTES / 1e6:.0f} MB slowly, if at all")


def default_path(loaded: Loaded) -> Path:
    """`<run>/explorer.html`; for a checkpoint outside any run, `<name>-explorer.html` beside it."""
    if loaded.run_dir is None:
        return loaded.checkpoint.with_name(f"{loaded.checkpoint.stem}-explorer.html")
    return loaded.run_dir / PAGE_NAME


# --- what the page embeds ---

def page_data(loaded: Loaded) -> dict:
    """The one JSON document of the page (see the module docstring)."""
    cfg, task, model, run_dir = loaded.config, loaded.task, loaded.model, loaded.run_dir
    pairs = loaded.ablation_pairs()  # means and live exact match: `minitfm ablate`'s set
    examples = pairs[:HELD_OUT_EXAMPLES]
    predictions = predict(model, task, [src for src, _ in examples], loaded.device)
    return {
        "meta": meta(loaded),
        "config": names_only(cfg.model_dump(mode="json")),
        "model": model_spec(model),
        "task": task_spec(cfg, task),
        "means": {f"{kind}.{layer}": floats(value)  # (H, K) each
                  for (kind, layer), value in replacements(loaded, pairs, "mean").items()},
        "mean_samples": len(pairs),
        "held_out": {"sources": [src for src, _ in examples],
                     "targets": [tgt for _, tgt in examples],
                     "predictions": predictions},  # PyTorch's, intact model
        "alignment": alignment(model, task, loaded.held_out()[:ALIGNMENT_SAMPLES]),
        "timeline": timeline(run_dir),
        "curves": curves(run_dir),
        "per_length": last_eval(run_dir),
        "ablation": ablation_pictures(run_dir),
        "palette": list(PALETTE), "gamma": GAMMA,  # the colours of the PNG figures
    }


def meta(loaded: Loaded) -> dict:
    """Where the page comes from: run, checkpoint, step, seed, version, dates."""
    path, run_dir = loaded.checkpoint, loaded.run_dir
    trained = datetime.datetime.fromtimestamp(path.stat().st_mtime).isoformat(timespec="seconds")
    return {"run": run_dir.name if run_dir is not None else None, "checkpoint": path.name,
            "step": loaded.step, "seed": loaded.config.seed, "task": loaded.config.task.name,
            "version": __version__, "saved": trained,
            "written": datetime.datetime.now().isoformat(timespec="seconds")}


# Config values that may be paths (absolute once resolved): the page shows their last names.
PATH_KEYS = ("task.train_path", "task.eval_path", "model.code", "log.dir")


def names_only(config: dict) -> dict:
    """A dumped config with each of PATH_KEYS as its last name (`data.tsv`): a page travels, the
    folders of the machine that wrote it stay there."""
    shown = {section: dict(values) if isinstance(values, dict) else values
             for section, values in config.items()}
    for key in PATH_KEYS:
        section, name = key.split(".")
        if isinstance(shown.get(section), dict) and isinstance(shown[section].get(name), str):
            shown[section][name] = Path(shown[section][name]).name
    return shown


def floats(tensor) -> str:
    """A tensor as base64 of little-endian float32 (4 bytes a number, 5.3 in base64)."""
    array = np.ascontiguousarray(tensor.detach().cpu().float().numpy(), dtype="<f4")
    return base64.b64encode(array.tobytes()).decode("ascii")


def model_spec(model) -> dict:
    """The model's config, ids, weights (one base64 blob and an index) and position tables."""
    cfg, state = model.config, model.state_dict()
    tied = model.generator.weight is model.embedding.weight  # one matrix: embed it once
    names = [name for name in state if not (tied and name == "generator.weight")]
    index, offset = {}, 0
    for name in names:
        index[f"model.{name}"] = [offset, list(state[name].shape)]
        offset += state[name].numel()
    blob = torch.cat([state[name].detach().float().cpu().flatten() for name in names])
    sizes = cfg.model_dump(mode="json", exclude={"code"})  # model.js needs no code's path
    return {"config": {**sizes, "vocab_size": model.vocab_size},
            "pad_id": model.pad_id, "bos_id": 1, "eos_id": 2, "index": index,
            "weights": floats(blob), **POSITION_TABLES[cfg.positional](model)}


def sinusoid_frequencies(model) -> dict:
    """θ_i of the sinusoids, as book.positions.sinusoids computes them."""
    d_model = model.config.d_model
    return {"inv_freq": torch.exp(torch.arange(0, d_model, 2)
                                  * (-math.log(10000.0) / d_model)).tolist()}


# What model.js's twin of each positional scheme (by its name in the catalog) reads besides
# the weights: the sinusoids' and RoPE's θ_i, ALiBi's slopes.
POSITION_TABLES = {
    "sinusoidal": sinusoid_frequencies,
    "learned": lambda model: {},  # its table is a weight
    "rope": lambda model: {"inv_freq": model.positional.inv_freq.cpu().tolist()},
    "alibi": lambda model: {"slopes": model.positional.slopes.cpu().tolist()},
    "none": lambda model: {},
}


def task_spec(cfg, task: Task) -> dict:
    """How task.js reads and writes the task's text: the vocabulary, the reading rule, the
    phrases of Python's messages, the longest input (the model's, at most PAGE_MAX_TOKENS) and
    the decoding caps."""
    spec = TASKS[task.name]
    reading = spec.reading or task.cfg.tokenize  # pairs: as task.tokenize, char or space
    reserved = (*SPECIAL_TOKENS, *spec.task_symbols)  # pairs: <unk> last
    limit = input_limit(cfg, task)  # None: positions without an end
    return {"name": task.name, "tokens": list(task.vocab.tokens), "reading": reading,
            "compact": task.compact, "separator": task.separator,
            "allowed": task._allowed(), "example": task._example_text(),
            "reserved": list(reserved),
            "unk_id": task.vocab.id(reserved[-1]) if task.name == "pairs" else None,
            "max_tokens": PAGE_MAX_TOKENS if limit is None else min(limit, PAGE_MAX_TOKENS),
            "caps": [task.max_target_len(n) + 1 for n in range(CAP_TABLE + 1)],  # + EOS
            "trained_lengths": [cfg.task.min_len, cfg.task.max_len]}


def alignment(model, task: Task, pairs) -> dict | None:
    """Each cross-attention head's alignment score (L, H), as visualize-attention gives it."""
    scores = alignment_scores(model, task, pairs)
    if scores is None:
        return None
    return {"samples": len(pairs), "soft": np.round(scores.soft.numpy(), 4).tolist(),
            "hard": np.round(scores.hard.numpy(), 4).tolist()}


# --- what the run recorded ---

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
    """Loss and exact match against step, from metrics.jsonl (None: no metrics)."""
    if run_dir is None:
        return None
    try:
        found = run_curves(run_dir)
    except (CheckpointError, OSError):
        return None
    train = [[r["step"], r["loss"]] for r in found["train"] if "loss" in r]
    return {"train": [train[i] for i in spread(len(train), MAX_TRAIN_POINTS)],
            "eval": [[r["step"], r.get("loss"), r.get("exact_match")] for r in found["eval"]]}


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


# --- the page ---

def source(name: str) -> str:
    """One of the page's files (minitfm/lab/look/explore/, shipped with the package)."""
    return resources.files("minitfm.lab.look").joinpath("explore", name).read_text(
        encoding="utf-8")


def embed_json(data) -> str:
    """Strict JSON (`files.to_json`: a number that is not finite is null) that cannot end its
    <script> element or be read as markup: <, >, & and the line separators U+2028/9 written as
    \\u escapes (the same strings to JSON.parse), as are the lone surrogates that stand for the
    bytes of a file name that are not UTF-8 (which the page's UTF-8 could not hold)."""
    text = to_json(data, ensure_ascii=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029\ud800-\udfff]", lambda m: f"\\u{ord(m[0]):04x}", text)


def render(data: dict) -> str:
    """The page: the template with its style sheet, data and scripts inlined; a
    Content-Security-Policy allows exactly these scripts (by hash) and nothing from outside."""
    scripts = [source(name) for name in SCRIPTS]
    for name, script in zip(SCRIPTS, scripts):
        assert "</" not in script, f"{name} must not hold '</' (it would end its element)"
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest())
                      .decode() + "'" for s in scripts)
    page = source("page.html")
    assert PAGE_MARK in page, "page.html's head must hold PAGE_MARK (the picture rule)"
    page = page.replace("/*CSP*/", f"default-src 'none'; script-src {hashes}; "
                        "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
                        "form-action 'none'")
    page = page.replace("/*STYLE*/", source("page.css"))
    page = page.replace("<!--SCRIPTS-->", "\n".join(f"<script>{s}</script>" for s in scripts))
    return page.replace("/*DATA*/", embed_json(data))  # last: data never meets a placeholder
