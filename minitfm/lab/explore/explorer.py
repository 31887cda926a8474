"""`minitfm explore`: a trained run in one self-contained, offline HTML page.

The page runs the model itself: `page/model.js` is the forward pass of book/model.py in
JavaScript, `page/task.js` reads typed input as `minitfm predict` does, `page/patching.js`
is activation patching and the logit lens (lab/interpret/patching.py and lens.py) on model.js's hook
points, `page/inside.js` draws the role cards, the patching view and the lens, and
`page/page.js` draws the rest and wires it up. This module gathers what they need from the
run (the weights, the head means `minitfm ablate` uses, held-out examples, and the run's records,
`explorer_records`: metrics.jsonl, attention.jsonl, the ablation pictures, explain's role
cards) into one JSON document and inlines it with the scripts and the style sheet.

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

from minitfm.book.metrics import predict
from minitfm.catalog import SPECIAL_TOKENS, TASKS
from minitfm.errors import MinitfmError
from minitfm.lab.attention.probe import ALIGNMENT_SAMPLES, alignment_scores
from minitfm.lab.explore.explorer_records import (
    ablation_pictures,
    curves,
    last_eval,
    role_cards,
    timeline,
)
from minitfm.lab.interpret.ablate import replacements
from minitfm.lab.loaded import Loaded
from minitfm.lab.measure.evaluate import input_limit
from minitfm.lab.pictures import GAMMA, PAGE_MARK, PAGE_SUFFIXES, PALETTE, check_output
from minitfm.run.files import to_json, write_atomic
from minitfm.tasks.base import Task
from minitfm.version import __version__

PAGE_NAME = "explorer.html"
# In this order: each uses those before it (page.js all of them).
SCRIPTS = ("task.js", "model.js", "patching.js", "inside.js", "page.js")
HELD_OUT_EXAMPLES = 200  # decoded live in the page when heads are switched off
CAP_TABLE = 8  # decoding caps tabulated for sources of 0..8 tokens, then extended linearly
# The longest input the page decodes (fewer where the positions end): at the default model size
# about a second a keystroke; 1,000 tokens took ten, and a page keeps every map it draws.
PAGE_MAX_TOKENS = 200
# The longest input the page patches: patching reruns the model once per head and once per
# position of each residual point; at the default model size 16 tokens take about 1.5 s, 32
# about 6 (docs/explore.md). `minitfm patch` takes longer inputs.
PATCH_MAX_TOKENS = 32
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
        "role_cards": role_cards(loaded),  # embedded from `minitfm explain`, or None
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
            "patch_max_tokens": PATCH_MAX_TOKENS if limit is None
            else min(limit, PATCH_MAX_TOKENS),
            "caps": [task.max_target_len(n) + 1 for n in range(CAP_TABLE + 1)],  # + EOS
            "trained_lengths": [cfg.task.min_len, cfg.task.max_len]}


def alignment(model, task: Task, pairs) -> dict | None:
    """Each cross-attention head's alignment score (L, H), as visualize-attention gives it."""
    scores = alignment_scores(model, task, pairs)
    if scores is None:
        return None
    return {"samples": len(pairs), "soft": np.round(scores.soft.numpy(), 4).tolist(),
            "hard": np.round(scores.hard.numpy(), 4).tolist()}


# --- the page ---

def source(name: str) -> str:
    """One of the page's files (minitfm/lab/explore/page/, shipped with the package)."""
    return resources.files("minitfm.lab.explore").joinpath("page", name).read_text(
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
