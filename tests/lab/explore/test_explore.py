"""`minitfm explore` (issue #30): the page's JavaScript model gives PyTorch's answers, the
page is one safe offline file, and `Run.predict(heads_off=...)` is what `minitfm ablate`
measures; (issue #41) its activation patching and logit lens give lab/interpret/patching.py's and
lens.py's figures, and it embeds `minitfm explain`'s role cards of its own weights only.

The numerics tests run the page's own scripts (minitfm/lab/explore/page/*.js) in Node on small
trained runs of every positional scheme and both layer-norm placements, and compare greedy
outputs, logits and attention weights with PyTorch. Node is `node` on PATH, else the one inside
the Playwright package (the dev extra); with neither they skip with one line, and under
MINITFM_CI=1 (.ci/run) they fail. The browser tests are in
tests/lab/explore/test_explore_browser.py.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from minitfm.app.api import load_run
from minitfm.config import load_config
from minitfm.errors import MinitfmError, shown_path
from minitfm.lab.explore.explorer import embed_json, page_data, task_spec, write_explorer
from minitfm.lab.interpret.ablate import ablated, replacements
from minitfm.lab.interpret.lens import logit_lens
from minitfm.lab.interpret.patching import contrast, corruption, patch_activations
from minitfm.lab.loaded import Loaded, load
from minitfm.lab.measure.evaluate import predict_lines
from minitfm.lab.options import AblateOptions
from minitfm.tasks import make_task
from minitfm.tasks.base import Task
from tests.helpers import TINY, assert_clean_error, missing, run_cli
from tests.helpers import train_bare as train


def find_node() -> str | None:
    """`node` on PATH, else the Node binary shipped inside the Playwright package."""
    if shutil.which("node"):
        return shutil.which("node")
    try:
        import playwright
    except ImportError:
        return None
    shipped = Path(playwright.__file__).parent / "driver" / "node"
    return str(shipped) if os.access(shipped, os.X_OK) else None


NODE = find_node()
EXPLORE_DIR = Path(__file__).resolve().parents[3] / "minitfm" / "lab" / "explore" / "page"
RUNNER = Path(__file__).resolve().parent / "js" / "run_model.js"
TOLERANCE = 1e-4  # the bar for logits and attention weights
NO_NODE = ("no Node.js (neither `node` on PATH nor Playwright's): install Node.js or the dev "
           "extra to check the page's JavaScript model against PyTorch")


@pytest.fixture
def node() -> str:
    if NODE is None:
        missing(NO_NODE)
    return NODE


def needs_node(test):
    """A test of the page's scripts, run by Node: slow, by the suite's rule (another process
    each; `make test` runs them, `make test-fast` leaves them out)."""
    return pytest.mark.slow(pytest.mark.usefixtures("node")(test))

SHORT = [*TINY, "log.tensorboard=false", "train.steps=30", "train.warmup_steps=5",
         "train.eval_every=30", "train.eval_samples=50", "train.target_exact_match=null"]
# every positional scheme, both layer-norm placements, tied and untied embeddings, three
# heads (ALiBi's slopes for a count that is no power of 2), add's two-number reading
CASES = {
    "sinusoidal-pre": ["model.positional=sinusoidal", "model.norm_first=true"],
    "learned-post-untied": ["task.name=reverse", "model.positional=learned",
                            "model.norm_first=false", "model.tie_embeddings=false",
                            "model.max_len=12"],
    "rope-post": ["task.name=sort", "model.positional=rope", "model.norm_first=false"],
    "alibi-pre-3-heads": ["model.positional=alibi", "model.n_heads=3", "model.d_model=24",
                          "model.tie_embeddings=false"],
    "none-post": ["task.name=sort", "model.positional=none", "model.norm_first=false"],
    "add-rope-pre": ["task.name=add", "task.max_len=3", "model.positional=rope"],
}


def test_every_positional_scheme_has_its_tables_and_a_case():
    # A scheme in the catalog has a JavaScript twin in model.js: the tables it reads
    # (POSITION_TABLES), and a case above that holds it to PyTorch's answers.
    from minitfm.catalog import POSITIONALS
    from minitfm.lab.explore.explorer import POSITION_TABLES

    assert tuple(POSITION_TABLES) == tuple(POSITIONALS)
    cased = {item.partition("=")[2] for overrides in CASES.values() for item in overrides
             if item.startswith("model.positional=")}
    assert cased == set(POSITIONALS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case trained for 30 steps: {name: run directory}."""
    root = tmp_path_factory.mktemp("explore")
    found = {}
    for name, overrides in CASES.items():
        found[name] = root / name
        train(load_config(None, [*SHORT, *overrides]), run_dir=found[name])
    return found


def page_of(run_dir: Path, model_edit=None) -> tuple:
    """(loaded run, data) of a run's last checkpoint; `model_edit(model)` first."""
    loaded = load(run_dir / "checkpoints" / "last.pt", device="cpu")
    if model_edit is not None:
        model_edit(loaded.model)
    return loaded, page_data(loaded)


def decoded(loaded: Loaded, text: str):
    """`minitfm predict`'s result for one input (`loaded.model` None: only reading it)."""
    return predict_lines(loaded, [(1, text)])


def run_node(data: dict, items: list[dict], tmp_path: Path) -> list:
    """What the page's scripts compute for `items` (see tests/lab/explore/js/run_model.js)."""
    data_file, items_file = tmp_path / "data.json", tmp_path / "items.json"
    data_file.write_text(embed_json(data), encoding="utf-8")
    items_file.write_text(json.dumps(items), encoding="utf-8")
    assert NODE is not None, NO_NODE
    done = subprocess.run([NODE, str(RUNNER), str(data_file), str(items_file)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MINITFM_EXPLORE_DIR": str(EXPLORE_DIR)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def inputs_of(task: Task, sources: list[list[int]]) -> list[str]:
    """Sources as a user types them: with spaces, and the first one without."""
    texts = [task.format(src) for src in sources]
    return [texts[0].replace(" ", ""), *texts[1:]] if task.compact else texts


@torch.no_grad()
def differences(model, result: dict) -> tuple[float, float]:
    """Largest |logit| and |attention weight| difference between the page and PyTorch, on
    PyTorch's teacher-forced pass over what the page decoded."""
    src = torch.tensor([result["src"]])  # (1, S)
    tgt_in = torch.tensor([[1, *result["decoded"][:-1]]])  # (1, T): BOS + the outputs read
    logits, maps = model(src, tgt_in, return_attention=True)
    logit_diff = (logits[0].double() - torch.tensor(result["logits"])).abs().max().item()
    weight_diff = 0.0
    for kind in ("encoder", "decoder", "cross"):
        assert len(result["maps"][kind]) == len(getattr(maps, kind)), kind  # every layer
        for layer, torch_map in enumerate(getattr(maps, kind)):  # (1, H, T_q, T_k)
            heads = result["maps"][kind][layer]
            assert len(heads) == torch_map.size(1), (kind, layer)  # every head
            for head, rows in enumerate(heads):
                assert len(rows) == torch_map.size(2), (kind, layer, head)  # every query
                for i, row in enumerate(rows):  # decoder rows stop at the diagonal
                    assert len(row) == (i + 1 if kind == "decoder" else torch_map.size(3))
                    theirs = torch_map[0, head, i].double()
                    weight_diff = max(weight_diff, (theirs[:len(row)] - torch.tensor(row))
                                      .abs().max().item())
                    assert not theirs[len(row):].any()  # masked in the page, 0 in PyTorch
    return logit_diff, weight_diff


# --- the numerics: the page's model against PyTorch ---

@needs_node
@pytest.mark.parametrize("case", list(CASES))
def test_the_page_model_decodes_as_pytorch_to_1e_4(runs, case, tmp_path):
    loaded, data = page_of(runs[case])
    task, model = loaded.task, loaded.model
    texts = inputs_of(task, data["held_out"]["sources"][:6])
    results = run_node(data, [{"text": t} for t in texts] + [{"held_out": True}], tmp_path)
    # one input per call, as the page decodes: `predict` caps a batch at its longest input's
    # cap, so an unfinished output (no EOS yet) depends on the other inputs of its call
    expected = [decoded(loaded, text).rows[0]["output"] for text in texts]
    assert [r["output"] for r in results[:-1]] == expected
    for result in results[:-1]:
        logit_diff, weight_diff = differences(model, result)
        assert logit_diff < TOLERANCE and weight_diff < TOLERANCE, (logit_diff, weight_diff)
    # all 200 embedded held-out examples: the page's greedy outputs are PyTorch's (batched
    # there, so cut to each input's own cap)
    sources = data["held_out"]["sources"]
    assert results[-1] == [pred[:task.max_target_len(len(src)) + 1] for src, pred in
                           zip(sources, data["held_out"]["predictions"], strict=True)]


@needs_node
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_heads_off_in_the_page_equal_run_predict_and_ablate(runs, mode, tmp_path):
    run_dir = runs["sinusoidal-pre"]
    loaded, data = page_of(run_dir)
    task, model = loaded.task, loaded.model
    heads_off = [("cross", 0, 1), ("encoder", 0, 0)]
    texts = inputs_of(task, data["held_out"]["sources"][:8])
    items = [{"text": t, "heads_off": [[*h, mode] for h in heads_off]} for t in texts]
    items.append({"held_out": True, "heads_off": [["cross", 0, 1, mode]]})
    results = run_node(data, items, tmp_path)
    run = load_run(run_dir, checkpoint="last")
    assert [r["output"] for r in results[:-1]] == [
        run.predict(text, heads_off=heads_off, mode=mode) for text in texts]
    for result in results[:-1]:
        assert max(differences_with_heads_off(run, result, heads_off, mode)) < TOLERANCE
    # one head off on the held-out examples: what `minitfm ablate` measures on them
    pairs = loaded.ablation_pairs()
    values = replacements(loaded, pairs, mode)[("cross", 0)]
    off = torch.tensor([False, True])
    from minitfm.book.metrics import evaluate
    from minitfm.lab.interpret.ablate import HeadAblation
    examples = pairs[:len(results[-1])]
    baseline = evaluate(model, task, examples, "cpu")
    measured = ablated(loaded, examples, baseline, {("cross", 0): HeadAblation(off, values)},
                       AblateOptions())
    page_exact = sum(out == tgt for out, (_, tgt) in zip(results[-1], examples)) / len(examples)
    assert page_exact == measured["exact_match"]


@needs_node
@pytest.mark.parametrize("case, heads_off, mode", [
    ("sinusoidal-pre", (), "zero"),
    ("sinusoidal-pre", (("cross", 0, 0), ("cross", 0, 1)), "zero"),
    ("alibi-pre-3-heads", (("cross", 0, 0), ("cross", 0, 2)), "mean"),
    ("rope-post", (("cross", 0, 1), ("encoder", 0, 0)), "mean"),
], ids=["heads-on", "both-cross-heads-zero", "two-of-3-cross-heads-mean", "cross-and-encoder"])
def test_the_page_one_input_at_a_time_equals_run_predict_in_any_batch(
        runs, case, heads_off, mode, tmp_path):
    """The page decodes one input at a time (no padding, its own cap); `Run.predict` decodes
    batches (padded, one chunk). The same inputs give the same outputs in batches of random
    sizes and orders, with and without heads switched off."""
    loaded, data = page_of(runs[case])
    generator = random.Random(case)
    sources = generator.sample(data["held_out"]["sources"], 24)
    assert len({len(src) for src in sources}) > 1  # caps differ within a batch
    texts = inputs_of(loaded.task, sources)
    off = [[*head, mode] for head in heads_off]
    page = [r["output"] for r in run_node(data, [{"text": t, "heads_off": off} for t in texts],
                                          tmp_path)]
    run = load_run(runs[case], checkpoint="last")
    for size in (len(texts), *(generator.randint(2, len(texts) - 1) for _ in range(3))):
        order = generator.sample(range(len(texts)), len(texts))
        answers = {}
        for start in range(0, len(order), size):
            part = order[start:start + size]
            outputs = run.predict([texts[i] for i in part], heads_off=heads_off, mode=mode)
            answers.update(zip(part, outputs, strict=True))
        assert [answers[i] for i in range(len(texts))] == page, (size, order)


def differences_with_heads_off(run, result, heads_off, mode) -> tuple[float, float]:
    from minitfm.lab.interpret.ablate import edited_heads, switched_off

    with edited_heads(run.model, switched_off(run, heads_off, mode)):
        return differences(run.model, result)


@needs_node
def test_an_exact_tie_goes_to_the_lower_id_as_torch_argmax_and_a_near_tie_is_flagged(
        runs, tmp_path):
    run_dir = runs["learned-post-untied"]
    loaded, _ = page_of(run_dir)
    task, model = loaded.task, loaded.model
    src = task.parse("3 1 4")
    with torch.no_grad():
        memory, src_mask, _ = model.encode(torch.tensor([src]))
        first = model.decode(torch.tensor([[1]]), memory, src_mask)[0][0, -1].argmax().item()
    lower = task.first_data_id if first > task.first_data_id else 2  # an id below it

    def tie(scale: float):
        def edit(m):
            with torch.no_grad():
                m.generator.weight[lower] = m.generator.weight[first] * scale
        return edit

    for scale, chosen in ((1.0, lower), (1.0 + 3e-7, None)):
        edited, data = page_of(run_dir, tie(scale))
        [result] = run_node(data, [{"text": "3 1 4"}], tmp_path)
        expected = decoded(edited, "3 1 4").rows[0]["output"]
        assert result["output"] == expected  # PyTorch's answer, tie or not
        assert result["near_ties"][0]  # the page says the first step was (nearly) a tie
        if chosen is not None:  # exactly equal logits: the first maximal index, as torch
            assert result["logits"][0][lower] == result["logits"][0][first]
            assert result["decoded"][0] == chosen


# --- issue #41: activation patching and the logit lens, computed in the page ---

def torch_corruption(model, task, src):
    """lab/interpret/patching.corruption, None where no one-token change changes the answer."""
    try:
        return corruption(model, task, src)
    except MinitfmError:
        return None


def typed_corruption(src, sources):
    """Another held-out source of the same length: a corruption as a user might type one."""
    return next((other for other in sources if len(other) == len(src) and other != src), None)


@needs_node
@pytest.mark.parametrize("case", list(CASES))
def test_patching_in_the_page_equals_patch_activations_to_1e_4(runs, case, tmp_path):
    """patching.js against lab/interpret/patching.py on the same inputs: the default corruption
    (the first one-token change that changes the answer), a typed one, the scored positions,
    and the restored share of every head and of the residual stream at every point and
    position."""
    loaded, data = page_of(runs[case])
    task, model = loaded.task, loaded.model
    sources = data["held_out"]["sources"][:12]
    found = run_node(data, [{"corruption": task.format(src)} for src in sources], tmp_path)
    assert [r["corrupt"] for r in found] == [torch_corruption(model, task, src) for src in sources]
    pairs = [(src, r["corrupt"]) for src, r in zip(sources, found) if r["corrupt"]][:2]
    assert pairs, "no held-out input of this run has a corruption"
    typed = typed_corruption(sources[0], data["held_out"]["sources"][12:])
    pairs.append((sources[0], typed))
    results = run_node(data, [{"patch": [task.format(c), task.format(k)]} for c, k in pairs],
                       tmp_path)
    compared = 0
    for (clean, corrupt), result in zip(pairs, results, strict=True):
        try:
            batch = contrast(model, task, [clean], [corrupt])
        except MinitfmError:  # the same answer: nothing to restore, in the page either
            assert "same answer" in result["error"]
            continue
        expected = patch_activations(model, batch)
        assert [tuple(s) for s in result["scored"]] == [(t, c, k) for _, t, c, k in batch.scored]
        assert abs(result["cleanDiff"] - expected.clean_diff) < TOLERANCE
        assert abs(result["corruptDiff"] - expected.corrupt_diff) < TOLERANCE
        for ours, theirs, key in ((result["heads"], expected.heads, ("kind", "layer", "head")),
                                  (result["residual"], expected.residual,
                                   ("stream", "layer", "position"))):
            page = {tuple(r[k] for k in key): r["restored"] for r in ours}
            torch_rows = {tuple(r[k] for k in key): r["restored"] for r in theirs}
            assert page.keys() == torch_rows.keys()  # every head, every point and position
            gap = max(abs(page[k] - torch_rows[k]) for k in page)
            assert gap < TOLERANCE, (key, gap)
        compared += 1
    assert compared >= 2


@needs_node
@pytest.mark.parametrize("case", ["sinusoidal-pre", "learned-post-untied", "rope-post"])
def test_patching_a_whole_point_in_the_page_gives_the_clean_run_exactly(runs, case, tmp_path):
    """As patching.py's test in float64: the memory, or the last decoder layer's output, taken
    from the clean run at every position gives the clean logits exactly, and a hook that
    changes nothing the corrupted ones (the page computes in float64 throughout)."""
    loaded, data = page_of(runs[case])
    task, model = loaded.task, loaded.model
    src = next(s for s in data["held_out"]["sources"]
               if torch_corruption(model, task, s) is not None)
    corrupt = torch_corruption(model, task, src)
    [result] = run_node(data, [{"exact": [task.format(src), task.format(corrupt)]}], tmp_path)
    assert result == {"memory": 0, "last": 0, "nothing": 0}


@needs_node
@pytest.mark.parametrize("case", list(CASES))
def test_the_logit_lens_in_the_page_equals_logit_lens_to_1e_4(runs, case, tmp_path):
    """patching.js's lens, both ways the page computes it (teacher-forced, and from the decoder
    outputs its greedy decoding kept), against lab/interpret/lens.py: the tokens written, and per
    decoder layer and step the token it would write, its probability and that of the written
    token."""
    loaded, data = page_of(runs[case])
    task, model = loaded.task, loaded.model
    sources = data["held_out"]["sources"][:6]
    texts = [task.format(src) for src in sources]
    results = run_node(data, [{"lens": t} for t in texts] + [{"lens_of_decoding": t}
                                                           for t in texts], tmp_path)
    token = task.vocab.token
    for i, src in enumerate(sources):
        expected = logit_lens(model, task, src)
        for result in (results[i], results[len(sources) + i]):
            assert [token(t) for t in result["written"]] == expected["written"]
            assert len(result["layers"]) == len(expected["layers"]) == len(model.decoder_layers)
            for ours, theirs in zip(result["layers"], expected["layers"], strict=True):
                assert len(ours) == len(theirs)
                for x, y in zip(ours, theirs, strict=True):
                    assert abs(x["p"] - y["p"]) < TOLERANCE, (x, y)
                    assert abs(x["p_written"] - y["p_written"]) < TOLERANCE, (x, y)
                    assert token(x["token"]) == y["token"] or abs(x["p"] - y["p"]) < 1e-6


# --- issue #41: the role cards, embedded from `minitfm explain` ---

def test_the_page_embeds_explains_role_cards_of_its_own_weights_only(runs, tmp_path):
    """docs/explore.md, section 4: the cards `minitfm explain` wrote beside its PNG, as it wrote
    them (maps to 3 decimals, file names without folders), within the size the docs give; none
    before explain; left out, with the reason, when damaged or measured on other weights."""
    run_dir = Path(shutil.copytree(runs["sinusoidal-pre"], tmp_path / "run"))
    loaded = load(run_dir / "checkpoints" / "last.pt", device="cpu")
    assert page_data(loaded)["role_cards"] is None
    result = run_cli("explain", run_dir, "--checkpoint", "last", "--samples", "40", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    path = run_dir / "explain" / f"last-step{loaded.step}.json"
    assert path.is_file() and path.with_suffix(".png").is_file()
    cards = page_data(loaded)["role_cards"]
    assert cards["file"] == path.name and "problem" not in cards, cards
    assert [{key: head[key] for key in card} for card, head in
            zip(cards["heads"], report["heads"], strict=True)] == cards["heads"]
    assert (cards["samples"], cards["step"]) == (40, loaded.step)
    written = json.loads(path.read_text())["maps"]
    assert cards["maps"].keys() == written.keys()
    for key, maps in cards["maps"].items():
        assert torch.allclose(torch.tensor(maps), torch.tensor(written[key]), atol=5e-4)
    text = embed_json(cards)
    assert str(tmp_path) not in text
    values = sum(torch.tensor(maps).numel() for maps in cards["maps"].values())
    per_weight, per_head = documented_card_size()
    assert len(text) <= per_weight * values + per_head * len(cards["heads"]), len(text)

    def problem(edit) -> str:
        edit()
        return page_data(load(run_dir / "checkpoints" / "last.pt", device="cpu"))[
            "role_cards"]["problem"]

    good = path.read_bytes()
    assert "damaged" in problem(lambda: path.write_text(good.decode()[:-200]))
    assert "damaged" in problem(lambda: path.write_text(
        good.decode().replace('"effect": "', '"effect": "<b>', 1)))
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    assert "cannot be read" in problem(lambda: (tmp_path / "elsewhere.json").write_bytes(good))
    path.unlink()
    assert "cannot be read" in problem(lambda: os.mkfifo(path))  # and it never hangs
    path.unlink()
    path.write_bytes(good)
    checkpoint = run_dir / "checkpoints" / "last.pt"
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    next(iter(state["model"].values())).add_(1.0)  # trained further, say
    assert "other weights" in problem(lambda: torch.save(state, checkpoint))


def documented_card_size() -> tuple[float, float]:
    """docs/explore.md: role cards add about N bytes a mean-map weight and M a head."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "explore.md").read_text()
    [(per_weight, per_head)] = re.findall(r"at most ([\d.]+) bytes a weight of the mean maps "
                                          r"and ([\d,]+) bytes a head", " ".join(doc.split()))
    return float(per_weight), float(per_head.replace(",", ""))


# --- reading typed input: the rules and messages of `minitfm predict` ---

TYPED = ["", "   ", "3 1 4", "314", "3x", "<eos>", "3 <bos>", "12 3", "x" * 200, "it's",
         'a"b', "\t\n", "３", "3\x851", "1\ufeff2", "12+34", "12 + 3 4", "1++2", "+5", "12",
         "1+2+3", "0" * 40, "7+5", "40 + 25", "7 +5", "3 4+5"]


@needs_node
@pytest.mark.parametrize("overrides", [
    ["task.name=reverse"], ["task.name=sort", "task.n_symbols=12"], ["task.name=add"],
    ["task.name=copy", "model.positional=learned", "model.max_len=20"],
    ["task.name=modadd"], ["task.name=modadd", "task.n_symbols=43"],
])
def test_typed_input_is_read_with_predicts_rules_and_messages(overrides, tmp_path):
    cfg = load_config(None, overrides)
    task = make_task(cfg.task)
    results = run_node({"task": task_spec(cfg, task)}, [{"text": t} for t in TYPED], tmp_path)
    for text, result in zip(TYPED, results, strict=True):
        reading = Loaded(Path("none.pt"), 0, cfg, task, None, "cpu")  # no model: only reading
        expected = decoded(reading, text) if not parses(cfg, task, text) else None
        if expected is None:
            assert result == {"src": parses(cfg, task, text)}, text
        else:
            assert result == {"error": str(expected.error)}, text


def parses(cfg, task, text):
    from minitfm.lab.measure.evaluate import input_limit

    try:
        return task.parse(text, max_tokens=input_limit(cfg, task))
    except MinitfmError:
        return None


def test_decoding_caps_extend_as_the_task_says():
    """task.js extends the embedded caps linearly: it must give max_target_len + 1."""
    for name in ("copy", "duplicate", "add"):
        cfg = load_config(None, [f"task.name={name}"])
        task = make_task(cfg.task)
        caps = task_spec(cfg, task)["caps"]
        last = len(caps) - 1
        for n in (1, 2, last, 20, 300):
            extended = caps[n] if n <= last else caps[last] + (caps[last] - caps[last - 1]) * (
                n - last)
            assert extended == task.max_target_len(n) + 1, (name, n)


# --- the page: one file, data never markup, the command ---

def test_explore_writes_one_offline_page_and_prints_path_and_size(runs):
    run_dir = runs["sinusoidal-pre"]
    result = run_cli("explore", str(run_dir))
    assert result.exit_code == 0, result.stderr
    page = run_dir / "explorer.html"
    assert shown_path(page) in result.stdout and "kB" in result.stdout
    html = page.read_text(encoding="utf-8")
    for outside in ("http://", "https://", "fetch(", "XMLHttpRequest", "import(", "@import",
                    "src=\"http", "url("):
        assert outside not in html, outside
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


@pytest.mark.parametrize("opened", [True, False])
def test_explore_open_opens_the_page_or_says_there_is_no_browser(runs, monkeypatch, opened):
    """`--open` hands the page's file:// address to the browser; without one, a note."""
    asked = []
    monkeypatch.setattr("webbrowser.open", lambda url: asked.append(url) or opened)
    result = run_cli("explore", str(runs["rope-post"]), "--open")
    assert result.exit_code == 0, result.stderr
    assert asked == [(runs["rope-post"] / "explorer.html").resolve().as_uri()]
    note = "(no browser found here: open the file above in one)"
    assert (note in result.stdout) is not opened, result.stdout
    without = run_cli("explore", str(runs["rope-post"]))
    assert len(asked) == 1 and note not in without.stdout  # no --open: no browser


def test_the_page_embeds_the_runs_curves_evaluation_ablation_and_facts(runs, tmp_path):
    """docs/explore.md 3 and 5: the `minitfm ablate` picture, loss and exact match against
    step from metrics.jsonl, exact match per length from the last eval-A-B.json, and the seed,
    version and dates."""
    import minitfm

    run_dir = shutil.copytree(runs["sinusoidal-pre"], tmp_path / "run")
    ablate = run_cli("ablate", str(run_dir), "--checkpoint", "last", "--samples", "40")
    assert ablate.exit_code == 0, ablate.stderr
    [picture] = (run_dir / "ablate").glob("*.png")
    report = run_cli("eval", str(run_dir), "--checkpoint", "last", "--min-len", "1",
                     "--max-len", "6", "--samples", "60", "--json")
    assert report.exit_code == 0, report.stderr
    (run_dir / "eval-1-6.json").write_text(report.stdout, encoding="utf-8")  # as a sweep saves
    loaded = load(run_dir / "checkpoints" / "last.pt", device="cpu")
    data = page_data(loaded)
    assert data["ablation"] == [{"name": picture.name,
                                 "png": base64.b64encode(picture.read_bytes()).decode()}]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [[r["step"], r["loss"]] for r in records if r["split"] == "train"]
    assert data["curves"]["train"] == train_records and len(train_records) == 3  # 10, 20, 30
    assert data["curves"]["eval"] == [[r["step"], r["loss"], r["exact_match"]]
                                      for r in records if r["split"] == "eval"] != []
    per_length = json.loads(report.stdout)["per_length"]
    assert data["per_length"] == {"file": "eval-1-6.json", "per_length": {
        n: [row["exact_match"], row["count"]] for n, row in per_length.items()}}
    assert sorted(map(int, per_length)) == list(range(1, 7))
    meta = data["meta"]
    assert (meta["run"], meta["checkpoint"], meta["step"], meta["seed"], meta["version"]) == \
        ("run", "last.pt", 30, loaded.config.seed, minitfm.__version__)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", meta["saved"]) and meta["written"]
    assert data["config"] == loaded.config.model_dump(mode="json")


def test_the_page_is_about_5_3_bytes_per_parameter_plus_the_runs_records(tmp_path):
    """docs/explore.md, Share it: the weights as base64 float32 (5.33 bytes a parameter), and a
    one-step run of configs/reverse.yaml the size its table says (within 10%)."""
    root = Path(__file__).resolve().parents[3]
    cfg = load_config(root / "configs" / "reverse.yaml",
                      ["train.steps=1", "train.eval_samples=200", "log.tensorboard=false"])
    train(cfg, run_dir=tmp_path / "reverse")
    loaded = load(tmp_path / "reverse", "last", device="cpu")
    page = write_explorer(loaded, tmp_path / "page.html")
    params = sum(p.numel() for p in loaded.model.parameters())
    html = page.path.read_text(encoding="utf-8")
    [weights] = re.findall(r'"weights":"([A-Za-z0-9+/=]+)"', html)
    assert 5.3 <= len(weights) / params <= 5.4, len(weights) / params
    table = (root / "docs" / "explore.md").read_text(encoding="utf-8")
    [documented] = re.findall(r"\| reverse \| ([\d,]+) kB \|", table)
    assert abs(page.size / 1000 - int(documented.replace(",", ""))) <= 0.1 * page.size / 1000, \
        (page.size, documented)
    assert page.size == len(html.encode("utf-8"))


def test_embedded_json_cannot_end_its_script_element():
    nasty = {"symbols": ["</script>", "<img src=x onerror=alert(1)>", "a&b", "\u2028\u2029",
                         "javascript:alert(1)", "<!--"]}
    text = embed_json(nasty)
    assert not any(char in text for char in "<>&\u2028\u2029")
    assert json.loads(text) == nasty


def test_explore_refuses_a_missing_or_broken_run_in_one_line(tmp_path):
    assert_clean_error(run_cli("explore", str(tmp_path / "nothing")), 2, "not found")
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    assert_clean_error(run_cli("explore", str(broken)), 2)
    assert not list(tmp_path.glob("*.html"))


def test_explore_out_must_be_html(runs, tmp_path):
    assert_clean_error(run_cli("explore", str(runs["rope-post"]), "--out",
                               str(tmp_path / "page.png")), 2, ".html")


def test_run_predict_heads_off_refuses_bad_heads_in_one_line(runs):
    run = load_run(runs["sinusoidal-pre"], checkpoint="last")
    for heads_off, needle in (([("self", 0, 0)], "kind"), ([("cross", 5, 0)], "layer"),
                              ([("cross", 0, 9)], "head"), ([("cross", 0)], "(kind, layer")):
        with pytest.raises(MinitfmError, match=needle.replace("(", r"\(")):
            run.predict("3 1", heads_off=heads_off)
    with pytest.raises(MinitfmError, match=r"^mode \('half'\) must be one of zero, mean$"):
        run.predict("3 1", heads_off=[("cross", 0, 0)], mode="half")  # the API's argument


# --- the fourth adversarial report: what the page holds and accepts, what explore writes ---

def embedded(page: Path) -> dict:
    """The page's JSON document, read as a strict parser reads it (no NaN, no Infinity)."""
    html = page.read_text(encoding="utf-8")
    text = html.split('<script type="application/json" id="minitfm-data">', 1)[1]
    return json.loads(text.split("</script>", 1)[0], parse_constant=lambda constant: 1 / 0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A tiny run with metrics.jsonl and attention.jsonl (recorded at each evaluation)."""
    from minitfm.app.api import train_run

    run_dir = tmp_path_factory.mktemp("recorded") / "run"
    train_run(load_config(None, [*SHORT, "train.eval_every=10", "log.attention_every=eval"]),
              run_dir=run_dir)
    return run_dir


def nan_metrics(run_dir: Path) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 30, "split": "eval", "loss": NaN, "token_accuracy": 0.1, '
                '"exact_match": 0.0, "samples": 50}\n')


def infinite_eval(run_dir: Path) -> None:
    (run_dir / "eval-1-16.json").write_text(
        '{"exact_match": Infinity, "per_length": {"3": {"exact_match": Infinity, '
        '"token_accuracy": 1.0, "count": 5}}}')


def nan_attention(run_dir: Path) -> None:
    path = run_dir / "attention.jsonl"
    last = json.loads(path.read_text().splitlines()[-1])
    last["alignment"] = [[float("nan")] * len(row) for row in last["alignment"]]
    last["step"] += 1
    with open(path, "a") as f:
        f.write(json.dumps(last) + "\n")


def nan_weights(run_dir: Path) -> None:
    for path in (run_dir / "checkpoints").glob("*.pt"):
        state = torch.load(path, map_location="cpu", weights_only=True)
        for tensor in state["model"].values():
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
        torch.save(state, path)


NON_FINITE = {  # EX_nan_metrics, EX_inf_evaljson, EX_nan_attention, EX_nan_weights
    "nan_metrics": (nan_metrics, lambda data: data["curves"]["eval"][-1][1]),
    # an evaluation file with a number out of 0..1 is damaged (curves.read_eval): left out
    "inf_evaljson": (infinite_eval, lambda data: data["per_length"]),
    "nan_attention": (nan_attention, lambda data: data["timeline"]["alignment"][-1][0][0]),
    "nan_weights": (nan_weights, lambda data: data["alignment"]["soft"][0][0]),
}


@pytest.mark.parametrize("case", list(NON_FINITE))
def test_non_finite_numbers_in_a_run_are_null_in_the_page(recorded, tmp_path, case):
    damage, spot = NON_FINITE[case]
    run_dir = Path(shutil.copytree(recorded, tmp_path / case))
    damage(run_dir)
    result = run_cli("explore", run_dir, "--checkpoint", "last")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert spot(embedded(run_dir / "explorer.html")) is None


def test_explore_replaces_only_a_page_minitfm_wrote_unless_forced(recorded, tmp_path):
    """EX_out_user and EX_loose_default: the picture rule, for the page."""
    mine = tmp_path / "mine.html"
    mine.write_text("my precious page")
    assert_clean_error(run_cli("explore", recorded, "--out", mine), 2, "--out", "--force")
    assert mine.read_text() == "my precious page"
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(recorded / "checkpoints" / "last.pt", loose / "model.pt")
    (loose / "model-explorer.html").write_text("notes")
    assert_clean_error(run_cli("explore", loose / "model.pt"), 2, "model-explorer.html",
                       "--force")
    assert (loose / "model-explorer.html").read_text() == "notes"
    assert run_cli("explore", recorded, "--out", mine, "--force").exit_code == 0
    assert embedded(mine)["meta"]["step"] == 30
    again = run_cli("explore", recorded, "--out", mine)  # minitfm's own page now
    assert again.exit_code == 0, again.stderr


@pytest.mark.parametrize("name, shown", [("x\x1b[31mRED.html", "x\\x1b[31mRED.html"),
                                         ("re\u202elmth.html", "re\\u202elmth.html")])
def test_explore_prints_the_page_path_escaped(recorded, tmp_path, name, shown):
    """EX_out_esc: the `wrote` line, as every command's."""
    result = run_cli("explore", recorded, "--out", tmp_path / name)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"wrote {shown_path(tmp_path)}/{shown} (")
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout


def test_the_page_names_files_without_their_folders(tmp_path):
    """EX_abs_path: a pairs run's task.train_path (and log.dir) travel as names only."""
    data = tmp_path / "private" / "data.tsv"
    data.parent.mkdir()
    data.write_text("".join(f"{a} {b}\t{b} {a}\n" for a in "abcd" for b in "abcd"))
    run_dir = tmp_path / "run"
    train(load_config(None, [
        "task.name=pairs", f"task.train_path={data}", "task.tokenize=space",
        f"log.dir={tmp_path / 'logs'}", "model.d_model=16", "model.n_heads=2",
        "model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_ff=32",
        "model.max_len=8", "train.steps=4", "train.batch_size=8", "train.eval_every=4",
        "train.eval_samples=4", "log.tensorboard=false", "log.attention_every=0"]),
        run_dir=run_dir)
    result = run_cli("explore", run_dir)
    assert result.exit_code == 0, result.stderr
    page = run_dir / "explorer.html"
    assert str(tmp_path) not in page.read_text(encoding="utf-8")
    config = embedded(page)["config"]
    assert config["task"]["train_path"] == "data.tsv" and config["log"]["dir"] == "logs"


def test_explore_warns_in_one_line_when_the_page_will_be_large(recorded, tmp_path,
                                                                  monkeypatch):
    """EX_big_page, at a bound lowered for the test."""
    from minitfm.lab.explore import explorer

    monkeypatch.setattr(explorer, "PAGE_WARN_BYTES", 1000, raising=False)
    result = run_cli("explore", recorded, "--out", tmp_path / "page.html")
    assert result.exit_code == 0, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("warning: the page will be about ") and " MB" in line, line


@needs_node
@pytest.mark.parametrize("case", list(CASES))
def test_the_page_decodes_inputs_up_to_one_bound(case, tmp_path):
    """EX_long_input: every positional scheme has a longest input in the page, and a longer
    one is refused with Python's message, before any decoding."""
    cfg = load_config(None, [*SHORT, *CASES[case]])
    task = make_task(cfg.task)
    spec = task_spec(cfg, task)
    assert isinstance(spec["max_tokens"], int) and 1 <= spec["max_tokens"] <= 1000
    symbol = task.vocab.tokens[task.first_data_id]
    n = spec["max_tokens"] + 1
    longest = (f"{symbol} " * (n // 2)) + "+" + (f" {symbol}" * (n - n // 2 - 1)) \
        if task.name == "add" else " ".join([symbol] * n)
    [result] = run_node({"task": spec}, [{"text": " ".join([symbol] * 1000)}], tmp_path)
    assert "more than the" in result["error"] and "allowed" in result["error"], result
    [result] = run_node({"task": spec}, [{"text": longest}], tmp_path)
    assert f"more than the {spec['max_tokens']} allowed" in result["error"], result


def test_explore_registers_its_threads(recorded, tmp_path, monkeypatch):
    """EX_registry: explore computes, so it registers in the thread registry as eval does."""
    from minitfm.lab.explore import explorer

    registry = tmp_path / "registry"
    monkeypatch.setenv("MINITFM_REGISTRY", str(registry))
    seen = []
    original = explorer.page_data

    def watched(loaded):
        seen.append(sorted(p.name for p in registry.iterdir()) if registry.is_dir() else [])
        return original(loaded)

    monkeypatch.setattr(explorer, "page_data", watched)
    result = run_cli("explore", recorded, "--out", tmp_path / "page.html")
    assert result.exit_code == 0, result.stderr
    assert seen == [[str(os.getpid())]]
