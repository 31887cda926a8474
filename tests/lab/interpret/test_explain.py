"""`minitfm explain` and `minitfm patch`: patching is exact where it must be (float64), does not
depend on the batch, the drops' intervals are what they say, and on trained models the role
cards' claims hold when tested independently (heads switched off through `Run.predict`, maps
through `Run.attention`)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from minitfm.config import Config
from minitfm.errors import shown_path
from minitfm.fast.model import build_model
from minitfm.lab.interpret.explain import Drop
from minitfm.lab.interpret.patching import (
    contrast,
    patch_activations,
    position_patch,
    recorded,
    residual_edits,
    residual_points,
)
from minitfm.lab.interpret.patterns import pattern_keys
from minitfm.tasks import make_task
from tests.helpers import QUICK, TINY, assert_clean_error, run_cli


def tiny_model(code: str, norm_first: bool = True):
    """An untrained model in float64: exactness needs no training."""
    cfg = Config.model_validate({"task": {"name": "reverse", "n_symbols": 6, "max_len": 8},
                                 "model": {"d_model": 16, "n_heads": 2, "d_ff": 32,
                                           "n_encoder_layers": 2, "n_decoder_layers": 2,
                                           "code": code, "norm_first": norm_first}})
    torch.manual_seed(0)
    task = make_task(cfg.task)
    return build_model(cfg, task).double().eval(), task


@pytest.mark.parametrize("code", ["fast", "book"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_patching_every_position_of_a_point_gives_the_clean_run_and_none_the_corrupted(
        code, norm_first):
    model, task = tiny_model(code, norm_first)
    clean, corrupt = [[3, 4, 5, 6, 7], [4, 4, 5, 8, 3]], [[7, 4, 5, 6, 3], [4, 3, 5, 8, 8]]
    src, bad = torch.tensor(clean), torch.tensor(corrupt)
    tgt = torch.tensor([[1, 5, 6, 7, 3, 4], [1, 6, 5, 7, 4, 3]])
    clean_logits, _, stream = recorded(model, src, tgt)
    with torch.no_grad():
        corrupt_logits = model(bad, tgt)
        last = ("decoder", len(model.decoder_layers) - 1)  # the output of the last layer
        for key, values in stream.items():
            edits = {key: lambda x, v=values: v}  # every position at once
            with residual_edits(model, edits):
                patched = model(bad, tgt)
            if key[0] == "encoder" or key == last:  # all that comes after depends on it alone
                assert torch.equal(patched, clean_logits), key
            else:  # the next decoder layers still read the corrupted memory
                assert not torch.equal(patched, clean_logits), key
            with residual_edits(model, {key: lambda x: x}):  # nothing patched
                assert torch.equal(model(bad, tgt), corrupt_logits), key
            position = values.size(1) - 1
            with residual_edits(model, {key: position_patch(values, position)}):
                assert model(bad, tgt).shape == clean_logits.shape
    assert set(stream) == set(residual_points(model))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("explain") / "run"
    result = run_cli("train", *QUICK, "log.tensorboard=false", "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    return run_dir


def test_restored_shares_do_not_depend_on_the_batch(quick):
    """Patching contrasts in one batch, in either order, gives the pooled figures of each
    alone (float64)."""
    from minitfm import load_run
    from minitfm.errors import MinitfmError
    from minitfm.lab.interpret.explain import resampled

    run = load_run(quick)
    model = run.model.double()
    usable = []
    for clean, bad in zip(*resampled(run, run.ablation_pairs(200)), strict=True):
        if len(clean) == 4 and len(usable) < 3:
            try:
                usable.append((contrast(model, run.task, [clean], [bad]), (clean, bad)))
            except MinitfmError:  # both answered alike
                continue
    assert len(usable) == 3
    alone = [patch_activations(model, batch, residual=False) for batch, _ in usable]
    for order in (usable, usable[::-1]):
        batch = contrast(model, run.task, [c for _, (c, _) in order], [b for _, (_, b) in order])
        together = patch_activations(model, batch, residual=False)
        assert together.clean_diff == pytest.approx(sum(a.clean_diff for a in alone), abs=1e-9)
        for i, row in enumerate(together.heads):
            assert row["logit_diff"] == pytest.approx(
                sum(a.heads[i]["logit_diff"] for a in alone), abs=1e-9)


def test_a_drop_and_its_interval_are_those_of_the_paired_rows():
    before = [True] * 80 + [False] * 20
    after = [False] * 30 + [True] * 50 + [False] * 20  # 30 rows lost, none gained
    drop = Drop.paired(before, after)
    assert drop.value == pytest.approx(0.30)
    half = 1.96 * math.sqrt(0.3 * 0.7 * 100 / 99 / 100)  # sample variance of 0/1 differences
    assert (drop.low, drop.high) == pytest.approx((0.30 - half, 0.30 + half))
    assert Drop.paired([True] * 10, [True] * 10).value == 0.0


@pytest.mark.parametrize("name,row,n,key", [
    ("mirror", 0, 5, 4), ("mirror", 5, 5, -1), ("same", 2, 5, 2), ("previous", 0, 5, -1),
    ("offset +2", 3, 5, -1), ("offset -1", 3, 5, 2), ("last", 1, 5, 4), ("first", 3, 5, 0)])
def test_the_pattern_family_gives_each_row_its_key(name, row, n, key):
    assert pattern_keys(name, row, n, None) == key


def test_one_teacher_forced_pass_gives_greedy_decodings_verdicts(quick, monkeypatch):
    """`correct` decides from one teacher-forced pass what `predict` decodes step by step: the
    same verdict for every row, intact and with each head off in either mode; with every
    verdict sent to decoding (SURE huge) or none (SURE 0) alike."""
    from minitfm import load_run
    from minitfm.book.metrics import predict
    from minitfm.lab.interpret import explain
    from minitfm.lab.interpret.ablate import edited_heads, heads_edits, replacements

    run = load_run(quick)
    pairs = run.ablation_pairs(300)
    values = {mode: replacements(run, pairs, mode) for mode in ("zero", "mean")}
    heads = [(kind, 0, head) for kind in ("encoder", "decoder", "cross") for head in range(2)]
    cases = [{}] + [heads_edits(values[mode], [h]) for h in heads for mode in values]
    decoded = []
    for edits in cases:
        with edited_heads(run.model, edits):
            outputs = predict(run.model, run.task, [src for src, _ in pairs], run.device)
        decoded.append([o == tgt for o, (_, tgt) in zip(outputs, pairs, strict=True)])
    assert len({sum(d) for d in decoded}) > 2  # the heads change the verdicts
    for sure in (explain.SURE, 0.0, 1e9):
        monkeypatch.setattr(explain, "SURE", sure)
        assert [explain.correct(run, pairs, edits) for edits in cases] == decoded, sure


def test_explain_prints_a_card_per_head_and_writes_the_picture(quick):
    result = run_cli("explain", str(quick), "--samples", "100", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["heads"]) == 3 * 2  # 3 kinds, 1 layer each, 2 heads
    for head in report["heads"]:
        assert {"kind", "layer", "head", "pattern", "pattern_score", "drop_zero", "drop_mean",
                "role", "restored"} <= set(head)
        assert head["kind"] in ("encoder", "decoder", "cross")
        assert head["drop_zero_ci"][0] <= head["drop_zero"] <= head["drop_zero_ci"][1]
    assert "negligible_together" in report and report["logit_lens"]["layers"]
    assert (quick / "explain" / f"best-step{report['step']}.png").is_file()
    table = run_cli("explain", str(quick), "--samples", "100")
    assert table.exit_code == 0 and "role cards" in table.stdout
    assert "most needed: " in table.stdout and "logit lens of " in table.stdout
    assert "negligible" in table.stdout.split("role cards")[1]


def test_explain_writes_its_report_as_json_beside_the_png_for_the_page(quick, tmp_path):
    """The JSON `minitfm explore` embeds (docs/explore.md, role cards): the `--json` report with
    the digest of the weights measured and each layer's mean maps; a file there that minitfm
    did not write is replaced only with --force, as the PNG."""
    from minitfm import load_run
    from minitfm.lab.interpret.explain import weights_digest

    out = tmp_path / "cards"
    result = run_cli("explain", str(quick), "--samples", "50", "--json", "--out", out)
    assert result.exit_code == 0, result.stderr
    [png] = out.glob("*.png")
    path = png.with_suffix(".json")
    written = json.loads(path.read_text())
    assert written["generator"] == "minitfm explain" and path.read_text().startswith(
        '{"generator": "minitfm explain"')
    assert written["heads"] == json.loads(result.stdout)["heads"]
    assert written["weights"] == weights_digest(load_run(quick).model)
    assert sorted(written["maps"]) == ["cross.0", "decoder.0", "encoder.0"]
    for maps in written["maps"].values():  # (H, T_q, T_k): each row a distribution
        assert len(maps) == 2
        assert all(abs(sum(row) - 1) < 1e-3 for head in maps for row in head)
    path.write_text('{"mine": 1}')
    assert_clean_error(run_cli("explain", str(quick), "--samples", "50", "--out", out), 2,
                       "--force")
    assert path.read_text() == '{"mine": 1}'
    again = run_cli("explain", str(quick), "--samples", "50", "--out", out, "--force")
    assert again.exit_code == 0, again.stderr
    assert json.loads(path.read_text())["generator"] == "minitfm explain"


def test_explain_out_names_its_files_as_in_the_runs_own_folder(quick, tmp_path):
    """--out DIR holds `<checkpoint>-step<N>.png` and its JSON, the names of <run>/explain/
    (where `minitfm explore` looks for them), not a name of its own."""
    result = run_cli("explain", str(quick), "--samples", "50", "--json", "--out", tmp_path)
    assert result.exit_code == 0, result.stderr
    step = json.loads(result.stdout)["step"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"best-step{step}.json",
                                                          f"best-step{step}.png"]


@pytest.mark.parametrize("name", ["cards.png", "cards.JSON"])
def test_explain_out_with_a_file_name_is_one_line_not_a_folder_of_that_name(quick, tmp_path,
                                                                           name):
    """--out is a folder for two files: a picture's name there would make a folder
    'cards.png' (it did); said in one line, with the folder to give instead."""
    result = run_cli("explain", str(quick), "--samples", "50", "--out", tmp_path / name)
    assert_clean_error(result, 2, "names a folder", f"--out {shown_path(tmp_path / 'cards')}")
    assert not (tmp_path / name).exists()


def test_patch_picks_a_corruption_that_changes_the_answer(quick):
    result = run_cli("patch", str(quick), "--clean", "1 2 3 4", "--json", "--force")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["clean_answer"] != report["corrupt_answer"]
    assert len(report["corrupt"].split()) == 4 and report["positions"]


def test_patch_warns_of_inputs_longer_than_the_trained_lengths(quick):
    """As predict does: the clean answer is the model's, and past 1..6 it may be wrong."""
    result = run_cli("patch", str(quick), "--clean", "1 2 3 4 1 2 3", "--force")
    assert result.exit_code == 0, result.stderr
    assert "longer than the lengths trained on (1..6" in result.stderr


@pytest.mark.parametrize("corrupt,needle", [("1 2 3", "same length"),
                                            ("1 2 3 4", "same answer")])
def test_patch_refuses_inputs_it_cannot_compare(quick, corrupt, needle):
    result = run_cli("patch", str(quick), "--clean", "1 2 3 4", "--corrupt", corrupt)
    assert_clean_error(result, 2, needle)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["reverse", "copy"])
def test_the_role_cards_claims_hold_when_tested(tmp_path, task):
    """Trained to its target: an essential head costs 10 points alone, the negligible ones at
    most 1 together, and a head called mirror (same) puts its strongest weight on n-1-i (i) in
    most rows; each checked through the API, apart from explain's own code."""
    from minitfm import load_run

    run_dir = tmp_path / "run"
    args = [*TINY, f"task.name={task}", "train.steps=600", "log.tensorboard=false",
            "threads=1"]
    assert run_cli("train", *args, "--run-dir", run_dir).exit_code == 0
    run = load_run(run_dir)
    report = run.explain(samples=1000)
    assert report.exact_match >= 0.9
    pairs = run.ablation_pairs(1000)
    sources = [run.task.format(src) for src, _ in pairs]
    answers = [run.task.format(tgt) for _, tgt in pairs]

    def exact(heads_off, mode):
        outputs = run.predict(sources, heads_off=heads_off, mode=mode)
        return sum(o == a for o, a in zip(outputs, answers, strict=True)) / len(answers)

    base = exact([], "zero")
    off = [c for c in report.cards if c.effect == "negligible"]
    for mode in ("zero", "mean"):
        heads = [(c.pattern.kind, c.pattern.layer, c.pattern.head) for c in off]
        assert base - exact(heads, mode) <= 0.01 + 1e-9
    for card in report.cards:
        p, (_, mode) = card.pattern, card.drop
        if card.effect == "essential":
            assert base - exact([(p.kind, p.layer, p.head)], mode) >= 0.10
        if p.kind == "cross" and p.pattern in ("mirror", "same"):
            rows = hits = 0
            for src, _ in pairs[:200]:
                maps = run.attention(run.task.format(src)).cross[p.layer][p.head]  # (T, S)
                n = len(src)
                for t in range(n):
                    key = n - 1 - t if p.pattern == "mirror" else t
                    hits += int(maps[t].argmax()) == key
                    rows += 1
            assert hits / rows > 0.5, (card.role, hits / rows)
    named = {c.pattern.pattern for c in report.cards if c.pattern.kind == "cross"
             and c.effect == "essential"}
    assert named & {"mirror" if task == "reverse" else "same", "unclear"}, named


# --- what `patch` prints and draws: labels, names and order (#51 part 5, newcomer #16) ---

@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """`minitfm patch` of one input of a quick run with two decoder layers (whose order of
    kinds differs from the model's order of passes): its report (API), the CLI's tables and
    JSON of the same command, and the picture's axes."""
    from minitfm import load_run
    from minitfm.lab.interpret.cards import patch_figure

    run_dir = tmp_path_factory.mktemp("patch") / "run"
    result = run_cli("train", *QUICK, "model.n_decoder_layers=2", "train.steps=30",
                     "log.tensorboard=false", "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    out = run_dir / "patch.png"
    report = load_run(run_dir).patch("1 2 3 4", out=out)
    args = ("patch", str(run_dir), "--clean", " ".join(report.clean), "--corrupt",
            " ".join(report.corrupt), "--out", out)
    table, as_json = run_cli(*args), run_cli(*args, "--json")
    assert table.exit_code == 0 and as_json.exit_code == 0, table.stderr + as_json.stderr
    return report, table.stdout, json.loads(as_json.stdout), patch_figure(report)


def table_rows(stdout: str, title: str) -> list[list[str]]:
    """The rows of the table `title` starts, header first, as cells."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith(("┏", "┡", "┗")) or line.startswith("└"):
            if line.startswith("└"):
                break
            continue
        rows.append([cell.strip() for cell in line.strip("┃│").replace("┃", "│").split("│")])
    return rows


def test_patch_labels_decoder_positions_by_the_token_each_writes(patched):
    """The encoder side is labelled by source position and token, the decoder side by output
    position as the explorer writes it: `i: read→written`, the written token `clean/corrupted`
    where the two answers differ (the scored positions)."""
    from tests.lab.attention.test_viz import texts_outside

    report, stdout, _, fig = patched
    clean, corrupt = report.clean, report.corrupt
    written = [*report.clean_answer, "<eos>"]
    theirs = [*report.corrupt_answer, "<eos>"]
    reads = ["<bos>", *report.clean_answer]
    expected = [f"{i}: {r}→{w}" + (f"/{theirs[i]}" if i < len(theirs) and theirs[i] != w else "")
                for i, (r, w) in enumerate(zip(reads, written))]
    assert any("/" in label for label in expected)  # the answers differ somewhere
    source = [f"{i}: {c}" if c == k else f"{i}: {c}/{k}" for i, (c, k) in
              enumerate(zip(clean, corrupt))]
    encoder = table_rows(stdout, "residual stream, encoder side")
    decoder = table_rows(stdout, "residual stream, decoder side")
    assert encoder[0][1:] == source and [row[0] for row in encoder[1:]] == [
        "encoder in L0", "memory"]
    assert decoder[0][1:] == expected and [row[0] for row in decoder[1:]] == [
        "decoder out L0", "decoder out L1"]
    labels = {ax.get_title(): [t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes
              if ax.get_xticklabels()}
    assert labels["residual stream, encoder side: source positions"] == source
    assert labels["residual stream, decoder side: output positions (read→written)"] == expected
    assert texts_outside(fig) == []


def test_patch_json_names_every_point_as_the_tables_do(patched):
    """One naming: a residual row's `point` is the table's row name, and its `layer` the
    number in that name (the input of encoder layer L, the output of decoder layer L)."""
    report, stdout, printed, _ = patched
    names = {row[0] for title in ("residual stream, encoder side", "residual stream, decoder "
                                  "side") for row in table_rows(stdout, title)[1:]}
    assert {row["point"] for row in printed["residual"]} == names
    for row in printed["residual"]:
        if row["point"] != "memory":
            side = "in" if row["stream"] == "encoder" else "out"
            assert row["point"] == f"{row['stream']} {side} L{row['layer']}", row
    decoder = [row for row in printed["residual"] if row["stream"] == "decoder"]
    assert {row["layer"] for row in decoder} == {0, 1}  # two decoder layers: L0 and L1


def test_patch_orders_the_heads_alike_everywhere(patched):
    """Kinds in the model's order (encoder, decoder, cross), then layers, then heads: in the
    table, the picture, the JSON and the report."""
    report, stdout, printed, fig = patched
    rows = [row[0] for row in table_rows(stdout, "heads: restored share")[1:]]
    assert rows == ["encoder L0", "decoder L0", "decoder L1", "cross L0", "cross L1"]
    picture = next(ax for ax in fig.axes if ax.get_title().startswith("heads"))
    assert [t.get_text() for t in picture.get_yticklabels()] == rows
    order = [(row["kind"], row["layer"], row["head"]) for row in printed["heads"]]
    assert order == sorted(order, key=lambda key: (("encoder", "decoder", "cross").index(key[0]),
                                                   key[1], key[2]))
    assert order == [(row["kind"], row["layer"], row["head"]) for row in report.heads]


def test_each_patched_pair_has_its_own_picture_and_a_rerun_replaces_its_own(quick):
    """The default picture is named after what was patched (checkpoint, step, and a digest of
    both inputs): another pair does not overwrite it, the same command replaces its own file,
    and a file of the user's there is replaced only with --force (lab/pictures.py's rule)."""
    folder = quick / "patch"
    shutil.rmtree(folder, ignore_errors=True)
    first = run_cli("patch", quick, "--clean", "1 2 3 4")
    assert first.exit_code == 0, first.stderr
    [png] = folder.glob("*.png")
    assert png.name.startswith("best-step") and f"wrote {shown_path(png)}" in first.stdout
    drawn = png.read_bytes()
    other = run_cli("patch", quick, "--clean", "2 3 4 1")
    assert other.exit_code == 0, other.stderr
    assert len(list(folder.glob("*.png"))) == 2 and png.read_bytes() == drawn
    again = run_cli("patch", quick, "--clean", "1 2 3 4")
    assert again.exit_code == 0 and f"wrote {shown_path(png)}" in again.stdout, again.stderr
    assert len(list(folder.glob("*.png"))) == 2
    png.write_bytes(b"mine")
    assert_clean_error(run_cli("patch", quick, "--clean", "1 2 3 4"), 2, "--force")
    assert png.read_bytes() == b"mine"


def test_the_role_cards_picture_says_what_unclear_means_and_numbers_the_positions(
        quick, tmp_path):
    """The PNG's legend gives the naming rule (why a head is "unclear"), a card names the best
    fit it fell short with, and the first map of each row numbers its rows and columns by
    position (thinned when they would not fit); every text lies inside the figure (newcomer
    #19)."""
    from minitfm import load_run
    from minitfm.lab.interpret.cards import cards_figure
    from minitfm.lab.interpret.patterns import FITS, WEIGHT, mean_maps
    from tests.lab.attention.test_viz import texts_outside

    run = load_run(quick)
    report = run.explain(samples=60, out=tmp_path)
    pairs = run.ablation_pairs(60)
    maps = mean_maps(run.model, run.task, pairs)
    long = {key: torch.full((value.size(0), 64, 64), 1 / 64) for key, value in maps.items()}
    for drawn in (maps, long):
        fig = cards_figure(report, drawn)
        assert texts_outside(fig) == []
        legend = " ".join(fig._supxlabel.get_text().split())
        assert "unclear" in legend and f"{FITS:.0%} of its rows" in legend, legend
        assert f"{WEIGHT:.0%} of the weight" in legend, legend
        panels = [ax for ax in fig.axes if ax.images]
        assert len(panels) == len(report.cards)
        for ax, card in zip(panels, report.cards, strict=True):
            queries, keys = drawn[(card.pattern.kind, card.pattern.layer)].shape[1:]
            for labels, n in ((ax.get_yticklabels(), queries), (ax.get_xticklabels(), keys)):
                every = 1 if n <= 16 else -(-n // 16)  # each position while 16 fit
                numbered = [str(i) for i in range(0, n, every)] if card.pattern.head == 0 else []
                assert [t.get_text() for t in labels] == numbered  # the first map of a row
            p = card.pattern
            if p.pattern in ("unclear", "diffuse"):
                assert f"{p.pattern} ({p.best_fit} {p.score:.2f})" in ax.get_title()
