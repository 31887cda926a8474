"""`minitfm explore`'s page in a real browser: the system's Chromium driven by Playwright
(never a browser Playwright downloads). Without Chromium or Playwright these tests skip with one
line saying how to run them; under MINITFM_CI=1 (.ci/run) they fail instead."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import torch

from minitfm.app.api import load_run
from minitfm.app.api import train_run as train  # with the attention recorder
from minitfm.book.metrics import evaluate
from minitfm.config import load_config
from minitfm.lab.explore.explorer import SCRIPTS, write_explorer
from minitfm.lab.interpret.ablate import HeadAblation, ablated, replacements
from minitfm.lab.interpret.lens import logit_lens
from minitfm.lab.interpret.patching import contrast, corruption, patch_activations
from minitfm.lab.loaded import load
from minitfm.lab.options import AblateOptions
from tests.helpers import TINY, missing, run_cli

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists()
                                        else None)
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def chromium():
    """Before any run is trained: skip (or, under MINITFM_CI=1, fail) without a browser."""
    if CHROMIUM is None or sync_playwright is None:
        missing("no Chromium/Playwright: apt-get install chromium and pip install playwright "
                "(the dev extra) to run the explorer's browser tests")
ARTEFACTS = Path(__file__).resolve().parents[3] / "test-artefacts"
NASTY = ["</script>", "<img src=x onerror=alert(1)>", "javascript:alert(1)"]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """A tiny copy run and a pairs run whose symbols are markup: {name: (run_dir, page)}."""
    root = tmp_path_factory.mktemp("browser")
    found = {}
    copy = root / "copy"
    train(load_config(None, [*TINY, "log.tensorboard=false", "train.steps=100",
                             "train.eval_every=25", "log.attention_every=eval"]), run_dir=copy)
    # the run's own records beside it: an ablation picture and a saved per-length evaluation
    assert run_cli("ablate", copy, "--checkpoint", "last", "--samples", "40").exit_code == 0
    report = run_cli("eval", copy, "--checkpoint", "last", "--samples", "60", "--json")
    (copy / "eval-1-6.json").write_text(report.stdout, encoding="utf-8")
    # and the role cards of `minitfm explain` (its JSON beside its PNG), which the page embeds
    assert run_cli("explain", copy, "--checkpoint", "last", "--samples", "60").exit_code == 0
    found["copy"] = (copy, write_explorer(load(copy, "last")).path)
    data = root / "nasty.tsv"
    rows = [f"{a} {b}\t{b} {a}" for a in NASTY + ["x", "y"] for b in NASTY + ["x", "y"]]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs = root / "pairs"
    train(load_config(None, [
        "task.name=pairs", f"task.train_path={data}", f"task.eval_path={data}",
        "task.tokenize=space", "model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "model.d_ff=32", "model.max_len=8", "train.steps=20",
        "train.batch_size=16", "train.eval_every=20", "train.eval_samples=10",
        "log.tensorboard=false", "log.attention_every=0"]), run_dir=pairs)
    found["pairs"] = (pairs, write_explorer(load(pairs, "last")).path)
    return found


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield instance
        instance.close()


def open_page(browser, path: Path, hash_: str = "", clock: bool = False, **options):
    """The page from its file:// path (`options` for the browser's new_page); every other
    request aborted and recorded, like every page error, console error and dialog. With
    `clock`, the page's timers wait for the test's `page.clock.run_for` (work the page does in
    slices runs only then, however loaded the machine)."""
    page = browser.new_page(**options)
    if clock:
        page.clock.install()
    problems = []
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
               else (problems.append(f"request {route.request.url}"), route.abort()))
    page.on("pageerror", lambda err: problems.append(f"page error {err}"))
    page.on("console", lambda msg: problems.append(f"console {msg.text}")
            if msg.type == "error" else None)
    page.on("dialog", lambda dialog: (problems.append(f"dialog {dialog.message}"),
                                      dialog.dismiss()))
    page.goto(path.resolve().as_uri() + hash_)
    page.wait_for_function("window.minitfm !== undefined")
    return page, problems


def test_typed_inputs_and_heads_off_equal_python(pages, browser):
    run_dir, path = pages["copy"]
    run = load_run(run_dir, checkpoint="last")
    page, problems = open_page(browser, path)
    for text in ("1 2 3", "4321", "0", "3 3 1 0 2 4"):
        assert page.evaluate("t => window.minitfm.predict(t).output", text) == run.predict(text)
        page.fill("#input", text)
        expected = run.predict(text)
        assert page.inner_text("#output") == (expected or "(empty)")  # what the user reads
    error = page.evaluate("() => window.minitfm.predict('9 x').error")
    assert error.startswith("input 1 ('9 x'):")
    for mode in ("zero", "mean"):
        page.evaluate(f"() => window.minitfm.setHead('cross', 0, 1, '{mode}')")
        for text in ("1 2 3", "4 0 2 1"):
            assert page.evaluate("t => window.minitfm.predict(t).output", text) == \
                run.predict(text, heads_off=[("cross", 0, 1)], mode=mode)
    # the held-out exact match with the head off: what `minitfm ablate` measures on them
    loaded = load(run_dir, "last", device="cpu")
    shown = page.evaluate("() => window.minitfm.exactMatch()")  # joins the page's own job
    examples = loaded.ablation_pairs()[:len(page.evaluate(
        "() => window.minitfm.data.held_out.sources"))]
    values = replacements(loaded, loaded.ablation_pairs(), "mean")[("cross", 0)]
    baseline = evaluate(loaded.model, loaded.task, examples, "cpu")
    measured = ablated(loaded, examples, baseline, {
        ("cross", 0): HeadAblation(torch.tensor([False, True]), values)}, AblateOptions())
    assert shown == measured["exact_match"]
    assert page.inner_text("#exact").startswith(
        f"held-out exact match on {len(examples)} examples: {100 * shown:.1f}% with 1 head(s)")
    # the state is in the address: reopened from it, the same view
    url = page.url
    assert "off=cross.0.1.mean" in url
    again, more = open_page(browser, path, "#" + url.split("#", 1)[1])
    assert again.input_value("#input") == page.input_value("#input")
    assert again.evaluate("() => window.minitfm.state.off") == {"cross.0.1": "mean"}
    # the training slider
    slider = again.locator("#training-step")
    first = again.inner_text("#training-label")
    slider.fill("0")
    assert again.inner_text("#training-label") != first and "step" in first
    ARTEFACTS.mkdir(exist_ok=True)
    again.screenshot(path=str(ARTEFACTS / "explorer.png"), full_page=True)
    assert problems == [] and more == []


def test_the_page_says_what_it_knows_beside_the_output(pages, browser):
    """A held-out input gets right or wrong, switched-off heads say what the intact model writes,
    and a bad input leaves no other input's map under "this input"."""
    run_dir, path = pages["copy"]
    run = load_run(run_dir, checkpoint="last")
    page, problems = open_page(browser, path)
    tokens = page.evaluate("() => window.minitfm.data.task.tokens")
    held = page.evaluate("() => window.minitfm.data.held_out")
    for src, tgt in list(zip(held["sources"], held["targets"], strict=True))[:5]:
        text, target = (" ".join(tokens[i] for i in ids) for ids in (src, tgt))
        page.fill("#input", text)
        right = run.predict(text) == target
        assert page.inner_text("#verdict") == (
            "✓ the held-out target" if right else f"✗ the held-out target is {target}")
    page.evaluate("() => window.minitfm.setHead('cross', 0, 1, 'zero')")
    page.fill("#input", "4 0 2 1 3")
    verdict = page.inner_text("#verdict")
    assert "1 head(s) switched off" in verdict
    assert verdict.endswith(f"with every head on: {run.predict('4 0 2 1 3')}")
    page.fill("#input", "9 x")
    assert page.inner_text("#zoom-title") == "fix the input above to see its attention maps"
    assert page.inner_text("#readout") == "" and page.inner_text("#verdict") == ""
    assert problems == []


def test_held_out_exact_match_is_shown_under_the_heads_it_was_computed_for(pages, browser):
    """Heads switched faster than the page decodes its 200 held-out examples (a newcomer clicking
    two switches within half a second): the number shown at the end is the one Python gives for
    the heads off at the end, under their label. A cache hit used to leave an earlier state's job
    running, which then wrote its number under the later label ("56.5% (every head on)")."""
    run_dir, path = pages["copy"]
    run = load_run(run_dir, checkpoint="last")
    page, problems = open_page(browser, path, clock=True)
    sources, targets = held_out_texts(page)

    def python_exact(off):
        return exact_in_python(run, sources, targets, off)

    def switch(*heads, mode):  # one after the other, before the page's next timer
        for kind, layer, head in heads:
            page.evaluate("([k, l, h, m]) => window.minitfm.setHead(k, l, h, m)",
                          [kind, layer, head, mode])

    def shown():
        page.clock.run_for(60_000)  # every slice of every job still running
        return page.inner_text("#exact")

    intact = python_exact([])
    label = f"held-out exact match on {len(targets)} examples: "
    assert shown() == f"{label}{100 * intact:.1f}% (every head on)"
    a, b = ("cross", 0, 1), ("decoder", 0, 1)
    switch(a, mode="zero")
    switch(a, mode="on")  # back to a cached state while a's job runs
    assert shown() == f"{label}{100 * intact:.1f}% (every head on)"
    switch(a, mode="zero")
    assert shown() == f"{label}{100 * python_exact([a]):.1f}% with 1 head(s) switched off; " \
                      f"intact model: {100 * intact:.1f}%"
    switch(b, mode="zero")
    switch(b, mode="on")
    assert shown() == f"{label}{100 * python_exact([a]):.1f}% with 1 head(s) switched off; " \
                      f"intact model: {100 * intact:.1f}%"
    switch(b, mode="zero")
    switch(a, b, mode="on")  # a and b computed and cached by now: two cache hits in a row
    assert shown() == f"{label}{100 * intact:.1f}% (every head on)"
    assert len({intact, python_exact([a]), python_exact([a, b])}) == 3  # the test can tell


def held_out_texts(page) -> tuple[list[str], list[str]]:
    """The page's held-out examples (sources, targets) as text."""
    tokens = page.evaluate("() => window.minitfm.data.task.tokens")
    held = page.evaluate("() => window.minitfm.data.held_out")
    return tuple([" ".join(tokens[i] for i in ids) for ids in rows]
                 for rows in (held["sources"], held["targets"]))


def exact_in_python(run, sources: list[str], targets: list[str], off) -> float:
    """Python's exact match on the page's held-out examples with the heads `off` zeroed."""
    outputs = run.predict(sources, heads_off=off, mode="zero")
    return sum(o == t for o, t in zip(outputs, targets, strict=True)) / len(targets)


def test_exact_match_asked_while_the_page_computes_ends_on_a_number(pages, browser):
    """window.minitfm.exactMatch() called while the page decodes its held-out examples: for the
    page's own state it joins the page's job (the same number, shown under the label); for heads
    changed through `state` (no switch touched), the page's job is cancelled and the label ends
    on the number of the heads off now, never on "computing…"."""
    run_dir, path = pages["copy"]
    run = load_run(run_dir, checkpoint="last")
    page, problems = open_page(browser, path, clock=True)
    page.clock.pause_at(datetime.now() + timedelta(days=1))  # slices run only in run_for
    page.clock.run_for(60_000)
    sources, targets = held_out_texts(page)

    def python_exact(off):
        return exact_in_python(run, sources, targets, off)

    def asked(before: str = "") -> float:
        """exactMatch() called while the page's job waits for its first slice; its value."""
        page.evaluate("() => window.minitfm.setHead('cross', 0, 1, 'zero')")
        page.evaluate(f"() => {{ {before}; window.got = 'pending'; "
                      f"window.minitfm.exactMatch().then((v) => {{ window.got = v; }}); }}")
        page.clock.run_for(60_000)
        return page.evaluate("() => window.got")

    label = f"held-out exact match on {len(targets)} examples: "
    one, intact = python_exact([("cross", 0, 1)]), python_exact([])
    assert asked() == one
    assert page.inner_text("#exact") == f"{label}{100 * one:.1f}% with 1 head(s) switched " \
                                        f"off; intact model: {100 * intact:.1f}%"
    page.evaluate("() => window.minitfm.setHead('cross', 0, 1, 'on')")
    two = python_exact([("cross", 0, 1), ("cross", 0, 0)])
    assert asked("window.minitfm.state.off['cross.0.0'] = 'zero'") == two
    assert page.inner_text("#exact") == f"{label}{100 * two:.1f}% with 2 head(s) switched " \
                                        f"off; intact model: {100 * intact:.1f}%"
    assert problems == []


def test_a_wide_tables_row_keys_stay_in_view_when_it_scrolls(pages, browser):
    """The patching and logit-lens tables are wider than a narrow window (the default run's at
    1,300 pixels): each scrolls sideways to its last column, and the key of every row (its
    first cell: the point, the layer) stays in view when it does."""
    run_dir, path = pages["copy"]
    page, problems = open_page(browser, path, viewport={"width": 420, "height": 900})
    page.wait_for_function("() => document.querySelectorAll('#patch-result table').length === 3"
                           " && document.querySelector('#lens-table table') !== null")
    tables = page.evaluate("""() => [...document.querySelectorAll('.scroll')].map((wrap) => {
        wrap.scrollLeft = wrap.scrollWidth;  // to the last column
        const box = wrap.getBoundingClientRect(), rows = [...wrap.querySelectorAll('tr')];
        const edge = (cell) => cell.getBoundingClientRect();
        return { wide: wrap.scrollWidth > wrap.clientWidth + 1,
                 keys: rows.map((tr) => edge(tr.cells[0]).left - box.left),
                 ends: rows.map((tr) => box.right - edge(tr.cells[tr.cells.length - 1]).right) };
    })""")
    wide = [t for t in tables if t["wide"]]
    assert len(wide) >= 2, tables  # the decoder side and the lens, at least
    for table in wide:
        assert min(table["keys"]) >= -0.5, table  # every row's key in the box
        assert min(table["ends"]) >= -0.5, table  # the last column reached
    assert problems == []


def test_the_step_table_and_the_run_section_show_what_the_run_holds(pages, browser):
    """docs/explore.md 1 and 5: per step the token read, the token written, its probability
    and three runners-up; the ablation picture, the curves, exact match per length, the facts."""
    import minitfm

    run_dir, path = pages["copy"]
    loaded = load(run_dir, "last", device="cpu")
    page, problems = open_page(browser, path)
    page.fill("#input", "3 1 4 0")
    rows = [[cell.inner_text() for cell in row.locator("td").all()]
            for row in page.locator("#steps tbody tr").all()]
    decoded = page.evaluate("() => window.minitfm.predict('3 1 4 0').decoded")
    tokens = loaded.task.vocab.tokens
    assert [row[2] for row in rows] == [tokens[i] for i in decoded]  # writes
    assert [row[1] for row in rows] == [tokens[i] for i in [1, *decoded[:-1]]]  # reads <bos>...
    with torch.no_grad():  # PyTorch's probabilities, teacher-forced on what the page wrote
        logits = loaded.model(torch.tensor([loaded.task.parse("3 1 4 0")]),
                              torch.tensor([[1, *decoded[:-1]]]))
    probs = logits[0].double().softmax(-1)
    for t, row in enumerate(rows):
        assert abs(float(row[3].split()[0]) - probs[t, decoded[t]].item()) < 1e-4, row
        runners = [float(part.split()[-1]) for part in row[4].split(" · ")]
        assert len(runners) == 3 and runners == sorted(runners, reverse=True)
        assert runners[0] <= float(row[3].split()[0]), row
    assert page.locator("#ablation img").count() == 1
    assert page.locator("#curves canvas").count() == 3  # loss, exact match, the gauges
    per_length = json.loads((run_dir / "eval-1-6.json").read_text())["per_length"]
    assert page.locator("#per-length tr").count() == 1 + len(per_length)
    assert "eval-1-6.json" in page.inner_text("#per-length caption")
    facts = page.inner_text("#facts")
    for fact in (f"seed\n{loaded.config.seed}", f"minitfm\n{minitfm.__version__}",
                 "step 100", "checkpoint saved", "page written"):
        assert fact in facts, (fact, facts)
    assert json.loads(page.text_content("#config")) == loaded.config.model_dump(mode="json")
    assert problems == []


def test_the_page_follows_dark_mode_works_from_the_keyboard_and_prints(pages, browser):
    """docs/explore.md: "follows your system's light or dark setting, works from the keyboard,
    and prints"."""
    _, path = pages["copy"]
    background = "() => getComputedStyle(document.body).backgroundColor"
    light, _ = open_page(browser, path, color_scheme="light")
    page, problems = open_page(browser, path, color_scheme="dark")
    assert light.evaluate(background) == "rgb(255, 255, 255)"
    assert page.evaluate(background) == "rgb(22, 22, 22)"
    page.fill("#input", "3 1 4")
    page.focus("#zoom-canvas")
    first = page.inner_text("#readout")
    assert first.startswith("query 0 ") and " key 0 " in first
    page.keyboard.press("ArrowRight")
    assert " key 1 " in page.inner_text("#readout") and page.inner_text("#readout") != first
    page.keyboard.press("ArrowDown")
    assert page.inner_text("#readout").startswith("query 1 ")
    page.emulate_media(media="print")
    assert page.evaluate(background) == "rgb(255, 255, 255)"  # paper, whatever the setting
    assert page.evaluate("() => getComputedStyle(document.querySelector('#input')).display") \
        == "none"
    assert page.locator("#run").is_visible() and page.locator("#steps").is_visible()
    assert page.pdf().startswith(b"%PDF")
    assert problems == []


def test_markup_in_a_pairs_runs_symbols_runs_nothing(pages, browser):
    _, path = pages["pairs"]
    page, problems = open_page(browser, path)
    page.fill("#input", "</script> <img src=x onerror=alert(1)>")
    assert page.locator("img[src=x]").count() == 0
    result = page.evaluate("() => window.minitfm.predict('javascript:alert(1) x')")
    assert result["error"] is None
    assert page.evaluate("() => document.querySelectorAll('script').length") == 1 + len(SCRIPTS)
    assert "No role cards for this checkpoint yet" in page.inner_text("#role-cards")
    assert "</script>" in page.evaluate(
        "() => JSON.stringify(window.minitfm.data.task.tokens)")
    assert problems == []


def test_a_link_with_a_long_input_is_refused_not_decoded(pages, browser):
    """EX_long_input through `#input=`: the page says the bound and decodes nothing."""
    _, path = pages["copy"]
    page, problems = open_page(browser, path, "#input=" + "+".join(["1"] * 3000))
    assert "3000 tokens, more than the" in page.inner_text("#error")
    assert page.locator("#steps tbody tr").count() == 0
    assert "at most" in page.inner_text("#input-hint")
    assert problems == []


def test_a_page_of_non_finite_numbers_opens_without_errors(pages, browser, tmp_path):
    """EX_nan_weights and EX_nan_metrics in the browser: null numbers are drawn as gaps."""
    import json
    import shutil

    import torch

    run_dir = Path(shutil.copytree(pages["copy"][0], tmp_path / "nan"))
    for checkpoint in (run_dir / "checkpoints").glob("*.pt"):
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        for tensor in state["model"].values():
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
        torch.save(state, checkpoint)
    path = run_dir / "attention.jsonl"
    last = json.loads(path.read_text().splitlines()[-1])
    last["alignment"] = [[float("nan")] * len(row) for row in last["alignment"]]
    with open(path, "a") as f:
        f.write(json.dumps({**last, "step": last["step"] + 1}) + "\n")
    page_path = write_explorer(load(run_dir, "last")).path
    page, problems = open_page(browser, page_path)
    page.fill("#input", "1 2 3")
    assert page.locator("#alignment td").count() > 0
    assert problems == []


def test_role_cards_patching_and_the_logit_lens_show_pythons_figures(pages, browser):
    """docs/explore.md, sections 4 to 6, in the browser: a card per head with explain's role
    (embedded), the patching tables computed in the page with the shares of
    lab/interpret/patching.py for its default corruption (1e-4), the lens of lab/interpret/lens.py;
    no console error."""
    run_dir, path = pages["copy"]
    loaded = load(run_dir, "last", device="cpu")
    model, task = loaded.model, loaded.task
    page, problems = open_page(browser, path)
    report = json.loads((run_dir / "explain" / f"last-step{loaded.step}.json").read_text())
    assert page.locator("#role-cards figure.card").count() == len(report["heads"])
    assert page.locator("#role-cards figure.card canvas").count() == len(report["heads"])
    assert sorted(page.locator("#role-cards figcaption").all_inner_texts()) == \
        sorted(head["role"] for head in report["heads"])
    assert f"From last-step{loaded.step}.json" in page.inner_text("#role-cards")
    src = next(s for s in loaded.ablation_pairs()[:50] if has_corruption(model, task, s[0]))[0]
    text = task.format(src)
    result = page.evaluate("t => window.minitfm.patch(t, '')", text)
    assert result["corrupt"] == corruption(model, task, src)
    expected = patch_activations(model, contrast(model, task, [src], [result["corrupt"]]))
    for ours, theirs, key in ((result["heads"], expected.heads, ("kind", "layer", "head")),
                              (result["residual"], expected.residual,
                               ("stream", "layer", "position"))):
        page_rows = {tuple(r[k] for k in key): r["restored"] for r in ours}
        torch_rows = {tuple(r[k] for k in key): r["restored"] for r in theirs}
        assert page_rows.keys() == torch_rows.keys()
        assert max(abs(page_rows[k] - torch_rows[k]) for k in page_rows) < 1e-4
    tables = page.locator("#patch-result table")
    assert tables.count() == 3  # heads, encoder side, decoder side
    layers = model.config.n_encoder_layers + 2 * model.config.n_decoder_layers
    assert tables.nth(0).locator("tr").count() == 1 + layers
    shown = [float(cell) for cell in tables.nth(0).locator("td").all_inner_texts()]
    ordered = sorted(result["heads"], key=lambda r: (KINDS.index(r["kind"]), r["layer"],
                                                     r["head"]))
    assert len(shown) == len(ordered)  # each head's share, to 2 decimals, in the model's order
    assert all(abs(cell - r["restored"]) <= 0.005 + 1e-9 for cell, r in zip(shown, ordered))
    assert "scored at output position(s)" in page.inner_text("#patch-status")
    # the decoder side by output position, read→written as `minitfm patch` labels it
    from minitfm import load_run

    report = load_run(run_dir, "last").patch(text, task.format(result["corrupt"]),
                                             out=run_dir / "patch-of-the-page.png")
    header = tables.nth(2).locator("tr").first.locator("th").all_inner_texts()
    assert header[1:] == report.output_labels() and any("/" in c for c in header), header
    page.fill("#patch-corrupt", "1 2")
    page.click("#patch-run")
    assert "same length" in page.inner_text("#patch-error")
    most = page.evaluate("() => window.minitfm.data.task.patch_max_tokens")
    too_long = page.evaluate("t => window.minitfm.patch(t, '')", " ".join(["1"] * (most + 1)))
    assert f"at most {most}" in too_long["error"]  # reruns per position: bounded, as decoding
    page.fill("#input", text)
    lens = page.evaluate("t => window.minitfm.predict(t).lens", text)
    theirs = logit_lens(model, task, src)
    assert [task.vocab.token(t) for t in lens["written"]] == theirs["written"]
    for ours_layer, their_layer in zip(lens["layers"], theirs["layers"], strict=True):
        for x, y in zip(ours_layer, their_layer, strict=True):
            assert abs(x["p"] - y["p"]) < 1e-4 and abs(x["p_written"] - y["p_written"]) < 1e-4
    assert page.locator("#lens-table tr").count() == 1 + model.config.n_decoder_layers
    page.fill("#input", "9 x")
    assert page.inner_text("#lens-table") == "fix the input above to see its logit lens"
    assert problems == []


KINDS = ("encoder", "decoder", "cross")


def has_corruption(model, task, src) -> bool:
    from minitfm.errors import MinitfmError

    try:
        corruption(model, task, src)
    except MinitfmError:
        return False
    return True
