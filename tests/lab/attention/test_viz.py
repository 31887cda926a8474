"""Attention figures, terminal heatmaps, alignment scores and `minitfm visualize-attention`."""

import io
import struct
from dataclasses import replace

import numpy as np
import pytest
import torch
from matplotlib.text import Text
from rich.console import Console

from minitfm.app.commands.visualize_attention import attention_heatmaps, heatmap_legend
from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import load_config
from minitfm.errors import shown_path
from minitfm.lab.attention.figures import attention_figure
from minitfm.lab.attention.probe import (
    KIND_TITLES,
    KINDS,
    alignment_score,
    alignment_scores,
    map_blocks,
    only,
    pick_probe,
    run_probe,
)
from minitfm.tasks import make_task
from tests.helpers import QUICK, TINY, assert_clean_error, run_cli
from tests.helpers import train_bare as train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def untrained(n_layers: int, n_heads: int, task_name: str = "reverse"):
    """A random model (weights do not matter for layout) and its task."""
    cfg = load_config(None, [f"task.name={task_name}", f"model.n_encoder_layers={n_layers}",
                             f"model.n_decoder_layers={n_layers}", f"model.n_heads={n_heads}",
                             "model.d_model=16", "model.d_ff=32"])
    task = make_task(cfg.task)
    torch.manual_seed(0)
    return Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id).eval(), task


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """A tiny copy model trained for 200 steps (about 3 s), shared by the tests below."""
    run_dir = tmp_path_factory.mktemp("viz") / "copy"
    train(load_config(None, [*TINY, "train.target_exact_match=null", "log.tensorboard=false"]),
          run_dir=run_dir)
    return run_dir


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """A quick copy run (50 steps) for the command's tests, which need no aligned head."""
    run_dir = tmp_path_factory.mktemp("viz") / "quick"
    train(load_config(None, [*QUICK, "log.tensorboard=false"]), run_dir=run_dir)
    return run_dir


# --- alignment score ---

def test_alignment_score_is_one_for_a_perfect_map_and_1_over_s_for_uniform():
    S, ideal = 4, torch.tensor([[3, 2, 1, 0, -1]])  # reverse; the last row (EOS) is skipped
    perfect = torch.zeros(1, 1, 5, S)
    perfect[0, 0, torch.arange(4), ideal[0, :4]] = 1.0
    perfect[0, 0, 4] = torch.tensor([1.0, 0, 0, 0])  # the EOS row may look anywhere
    uniform = torch.full((1, 1, 5, S), 1 / S)
    scores = alignment_score(torch.cat([perfect, uniform], dim=1), ideal)  # (H=2,)
    assert scores.tolist() == pytest.approx([1.0, 1 / S])


def test_hard_alignment_score_counts_each_rows_argmax():
    ideal = torch.tensor([[2, 1, 0, -1], [0, -1, -1, -1]])  # reverse of 3, of 1; -1: skipped
    cross = torch.zeros(2, 1, 4, 3)  # (B, H, T, S); row 1's keys 1, 2 are padding
    cross[0, 0, :, :] = torch.tensor([[0.2, 0.3, 0.5],  # argmax 2: the ideal one
                                      [0.6, 0.3, 0.1],  # argmax 0, ideal 1: a miss
                                      [0.5, 0.4, 0.1],  # argmax 0: the ideal one
                                      [0.9, 0.1, 0.0]])  # EOS: not counted
    cross[1, 0, :, 0] = 1.0  # a one-token source: every row on it, only row 0 counted
    assert alignment_score(cross, ideal, hard=True).tolist() == [3 / 4]
    assert alignment_score(cross, ideal).tolist() == pytest.approx([(0.5 + 0.3 + 0.5 + 1) / 4])


@pytest.mark.parametrize("hard", [False, True])
def test_scores_of_a_padded_mixed_length_batch_are_those_of_its_examples(hard):
    """The held-out argmax share (and the mean weight): a padded batch of mixed lengths scores
    what its examples score one by one, each weighted by its target positions."""
    from minitfm.lab.attention.probe import head_scores

    model, task = untrained(2, 2)
    model = model.to(torch.float64)  # no near-tie of an argmax turns on float rounding
    generator = torch.Generator().manual_seed(3)
    pairs = list(task.sample(12, generator))
    assert len({len(src) for src, _ in pairs}) >= 3  # mixed lengths: the batch is padded
    kind = "hard" if hard else "soft"
    batch = getattr(head_scores(model, task, pairs), kind)  # (L, H)
    alone = [getattr(head_scores(model, task, [pair]), kind) for pair in pairs]
    weights = torch.tensor([float(len(task.alignment(src))) for src, _ in pairs])
    expected = sum(w * a for w, a in zip(weights, alone, strict=True)) / weights.sum()
    torch.testing.assert_close(batch, expected.to(batch.dtype), rtol=0, atol=1e-6)
    if hard:  # shares of rows: whole multiples of 1 / (all target positions)
        counts = batch * weights.sum()
        torch.testing.assert_close(counts, counts.round(), rtol=0, atol=1e-4)


def test_alignment_scores_none_without_an_ideal_alignment():
    model, task = untrained(1, 2, "add")
    pairs = [(task.parse("12+34"), task.target(task.parse("12+34")))]
    assert alignment_scores(model, task, pairs) is None


@pytest.mark.slow
def test_trained_copy_model_has_an_aligned_head(copy_run):
    from minitfm.lab.loaded import load
    from minitfm.tasks.base import eval_set

    run = load(copy_run / "checkpoints" / "last.pt", device="cpu")
    pairs = eval_set(run.task, 200, run.config.task.eval_seed)
    scores = alignment_scores(run.model, run.task, pairs).soft  # (1 layer, 2 heads)
    assert scores.shape == (1, 2)
    # Uniform attention on the same pairs: the baseline a head must beat.
    lengths = torch.tensor([len(src) for src, _ in pairs], dtype=torch.float)
    uniform = float((lengths * (1 / lengths)).sum() / lengths.sum())  # about 0.3 here
    # Measured 0.67..0.80 over seeds 0..3 after 200 steps (0.84 after 800): sharpening is slow.
    assert scores.max() > 0.55 and scores.max() > 2 * uniform, (scores, uniform)


# --- probe and figures ---

def test_pick_probe_is_the_first_of_the_longest_that_fits():
    pairs = [([5] * 3, [5] * 3), ([6] * 20, [6] * 20), ([7] * 9, [7] * 9), ([8] * 9, [8] * 9)]
    assert pick_probe(pairs) == pairs[2]
    assert pick_probe([pairs[1]]) == pairs[1]  # nothing fits: still a probe


def test_probe_decoder_input_is_bos_and_the_output():
    model, task = untrained(1, 2)
    src = task.parse("3 1 4")
    probe = run_probe(model, task, src)
    assert probe.decoder_input[0] == task.vocab.bos_id
    assert probe.decoder_input[1:] == probe.decoded[:-1]
    q, s = len(probe.decoder_input), len(src)
    assert probe.maps.cross[0].shape == (2, q, s) and probe.maps.decoder[0].shape == (2, q, q)
    assert probe.maps.encoder[0].shape == (2, s, s)


@torch.no_grad()
def test_probe_maps_are_those_of_step_by_step_decoding():
    model, task = untrained(2, 2)
    src = task.parse("3 1 4 1 5")
    probe = run_probe(model, task, src)
    memory, src_mask, _ = model.encode(torch.tensor([src]))
    cache = model.new_cache()
    for t, token in enumerate(probe.decoder_input):  # one token at a time, as decoding does
        _, _, cross = model.decode(torch.tensor([[token]]), memory, src_mask, cache)
        for layer in range(2):
            torch.testing.assert_close(cross[layer][0, :, 0], probe.maps.cross[layer][:, t])


@pytest.mark.parametrize("n_layers,n_heads", [(1, 1), (2, 2)])
def test_figure_has_a_panel_per_layer_and_head_of_each_kind(n_layers, n_heads):
    model, task = untrained(n_layers, n_heads)
    probe = run_probe(model, task, task.parse("3 1 4 1 5"))
    fig = attention_figure(map_blocks(probe, task), "title")
    images = [ax for ax in fig.get_axes() if ax.images]
    assert len(images) == len(KINDS) * n_layers * n_heads
    # Tokens on the axes: keys under each grid's bottom row, queries left of its first column.
    bottom_left = images[(n_layers - 1) * n_heads]
    assert [t.get_text() for t in bottom_left.get_xticklabels()] == list("31415")
    assert [t.get_text() for t in images[0].get_yticklabels()] == list("31415")
    assert images[-1].get_yticklabels() == [] or n_heads == 1
    labels = {ax.get_ylabel() for ax in fig.get_axes()}
    assert "attention weight\n(sqrt scale)" in labels  # the colour bars say how they scale


def texts_outside(fig) -> list[str]:
    """The visible texts of `fig` whose box, drawn by Agg, pokes out of the figure (the labels
    of ticks past an axis's limits, which a locator makes but Agg never draws, left out)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer, box = canvas.get_renderer(), fig.bbox
    undrawn = {id(label) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
               for tick in axis.get_major_ticks() + axis.get_minor_ticks()
               if not min(axis.get_view_interval()) - 1e-9 <= tick.get_loc()
               <= max(axis.get_view_interval()) + 1e-9
               for label in (tick.label1, tick.label2)}
    out = []
    for text in fig.findobj(Text):
        if text.get_visible() and text.get_text() and id(text) not in undrawn:
            b = text.get_window_extent(renderer)
            if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > box.x1 + 0.5 or b.y1 > box.y1 + 0.5:
                out.append(text.get_text())
    return out


# Every layout `visualize-attention` can make: one head or four, one kind or all, one layer or
# all, an input of 1, 16 or 64 tokens (the --input limit); an untrained model is wrong, so the
# title carries the longest verdict ("✗ (expected ...)"). The largest figures (a second each to
# draw) are in the slow half: the fast one draws every kind of layout at a smaller size.
LARGE = pytest.mark.slow
@pytest.mark.parametrize("n_layers,n_heads,n_tokens,kinds,layer,head", [
    (1, 1, 1, KINDS, None, None), (1, 1, 16, ("decoder",), None, None),
    (2, 4, 16, KINDS, 1, 1), (2, 4, 16, ("decoder",), 1, 1),
    pytest.param(2, 4, 16, KINDS, None, None, marks=LARGE),
    (2, 4, 1, ("cross",), None, 0), pytest.param(2, 2, 64, ("cross",), 1, None, marks=LARGE),
    pytest.param(2, 4, 64, KINDS, None, 0, marks=LARGE),
])
def test_every_title_and_label_lies_inside_the_figure(n_layers, n_heads, n_tokens, kinds,
                                                      layer, head):
    from pathlib import Path

    from minitfm.lab.attention.visualize import figure_title
    from minitfm.lab.loaded import Loaded

    model, task = untrained(n_layers, n_heads)
    src = task.parse(" ".join(str(i % 10) for i in range(n_tokens)))
    probe = run_probe(model, task, src)
    blocks = [only(block, layer, head) for block in map_blocks(probe, task, kinds)]
    loaded = Loaded(Path("runs/reverse-20260101-000000/checkpoints/best.pt"), 12345, None,
                    task, model, "cpu")
    title = figure_title(loaded, probe, task.target(src))
    fig = attention_figure(blocks, title)
    assert texts_outside(fig) == []
    shown = {text.get_text().replace("\n", " ") for text in fig.findobj(Text)}
    assert {KIND_TITLES[kind] for kind in kinds} <= shown  # wrapped, never cut
    assert title.replace("\n", " ") in shown


def test_grid_colours_follow_the_palette_on_the_square_root_scale():
    from minitfm.lab.pictures import PALETTE, colours

    def rgb(hex_colour):
        return [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]

    got = colours(np.array([0.0, 0.25, 1.0, float("nan")]))
    assert got.tolist() == [rgb(PALETTE[0]), rgb(PALETTE[4]), rgb(PALETTE[-1]), rgb(PALETTE[0])]


def test_grid_pictures_paste_each_map_in_its_cells_with_one_size_for_every_frame():
    from minitfm.lab.attention.mapgrid import MapGrid
    from minitfm.lab.pictures import colours

    model, task = untrained(2, 2)
    src = task.parse("3 1 4 1 5")
    target = task.target(src)
    block = map_blocks(run_probe(model, task, src, teacher=target), task, ("cross",))[0]
    assert block.queries == ["<bos>", *"51413"]  # teacher-forced: the target's axes
    grid = MapGrid(block, "cross-attention\nheader", "step 1000000000 · output 9 9 9 9 9 9 ✗")
    sharp = np.zeros_like(block.weights)  # (L, H, Q, K): every row on its ideal key
    sharp[..., np.arange(6), [4, 3, 2, 1, 0, 0]] = 1.0
    first, later = grid.frame(block, "step 10 · output 5 ✗"), grid.frame(
        replace(block, weights=sharp), "step 20 · output 5 1 4 1 3 ✓")
    assert first.shape == later.shape  # frames of one probe never change size
    pixels = later
    for r, c, x, y in grid.layout.maps(grid.top):
        for i, j, weight in [(0, 4, 1.0), (0, 0, 0.0), (3, 1, 1.0), (3, 4, 0.0)]:
            centre = pixels[y + i * grid.layout.cell + 2, x + j * grid.layout.cell + 2]
            assert centre.tolist() == colours(np.array(weight)).tolist(), (r, c, i, j)
    assert (first != pixels).any(axis=2).sum() > 100  # the maps, the caption


def test_grid_frames_are_the_pictures_their_captions_drawn_on_the_whole_canvas_give(
        monkeypatch):
    """A caption is drawn once on its own rows and pasted (`Captions`: once per snapshot for
    the heads of a kind): the frame is the one that drawing it on the whole picture gives, for
    a caption that fits, one longer than planned (drawn over the maps) and one Pillow's font
    lacks a glyph of."""
    from PIL import Image, ImageDraw

    from minitfm.lab.attention.mapgrid import Captions, MapGrid
    from minitfm.lab.attention.probe import only
    from minitfm.lab.pictures import colours

    def whole(grid, block, caption):  # how a frame was drawn before
        canvas = grid.background.copy()
        for r, c, x, y in grid.layout.maps(grid.top):
            canvas[y:y + grid.layout.map_h, x:x + grid.layout.map_w] = colours(
                block.weights[r, c]).repeat(grid.layout.cell, 0).repeat(grid.layout.cell, 1)
        image = Image.fromarray(canvas)
        lines = grid.wrap(grid.lettering([caption]).text(caption))
        grid.write(ImageDraw.Draw(image), lines, grid.caption_y)
        return np.asarray(image)

    drawn = []
    draw_caption = MapGrid.draw_caption
    monkeypatch.setattr(MapGrid, "draw_caption",
                        lambda self, text: drawn.append(text) or draw_caption(self, text))
    model, task = untrained(2, 2)
    src = task.parse("3 1 4 1 5")
    block = map_blocks(run_probe(model, task, src, teacher=task.target(src)), task,
                       ("cross",))[0]
    captions = Captions()
    heads = [only(block, 0, head) for head in (0, 1)]
    grids = [MapGrid(head, "cross-attention\nreverse · input 3 1 4 1 5 (colour ∝ √weight)",
                     "step 1000 · output 9 9 9 9 9 ✗", size=12, captions=captions)
             for head in heads]
    for caption in ["step 10 · output 5 ✗", "step 20 · output 5 1 4 1 3 ✓",
                    "step 30 · output 5 1 4 · " + "a much longer caption than planned " * 4,
                    "step 40 · output 가 ✗"]:
        for grid, head in zip(grids, heads, strict=True):
            assert (grid.frame(head, caption) == whole(grid, head, caption)).all(), caption
        assert drawn.count(caption) == 1  # the two heads' rows above their maps are alike


def test_long_titles_wrap_at_the_arrow_and_the_parenthesis():
    from minitfm.lab.pictures import wrap_to_width

    text = "decoder self-attention (query: decoder input, key: decoder input)"
    assert wrap_to_width(text, 20, 10) == text  # room enough: one line
    assert wrap_to_width(text, 3.3, 10) == ("decoder self-attention\n"
                                            "(query: decoder input, key: decoder input)")
    assert wrap_to_width("input 3 1 4 → prediction 4 1 3 ✓", 1.6, 11) == \
        "input 3 1 4\n→ prediction 4 1 3 ✓"
    name = "x" * 200 + ".pt"  # a word wider than the figure is cut, not left to overflow
    assert all(len(line) < 200 for line in wrap_to_width(name, 3, 11).split("\n"))


def test_png_grows_with_layers_and_heads(tmp_path):
    from minitfm.lab.pictures import save_png

    sizes = []
    for n_layers, n_heads in [(1, 1), (2, 2)]:
        model, task = untrained(n_layers, n_heads)
        probe = run_probe(model, task, task.parse("3 1 4 1 5"))
        path = tmp_path / f"{n_layers}x{n_heads}.png"
        save_png(attention_figure(map_blocks(probe, task), "title"), path)
        sizes.append(png_size(path))
    (w1, h1), (w2, h2) = sizes
    assert w2 > 1.5 * w1 and h2 > 1.5 * h1, sizes  # one more panel each way


def test_terminal_heatmap_shows_tokens_within_80_columns():
    model, task = untrained(1, 2)
    src = task.parse("0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5")  # 16 tokens
    probe = run_probe(model, task, src)
    console = Console(file=io.StringIO(), width=80, record=True, color_system=None)
    for renderable in attention_heatmaps(map_blocks(probe, task, ("cross",))):
        console.print(renderable)
    text = console.export_text()
    assert "cross-attention" in text and "head 0" in text and "head 1" in text
    assert " 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5" in text  # key tokens, two cells each
    assert "<bos>" in text  # query tokens label the rows
    assert max(len(line) for line in text.splitlines()) <= 80


def test_rows_say_what_each_step_read_and_wrote_and_the_legend_only_shortens_what_shows():
    model, task = untrained(1, 1)
    probe = run_probe(model, task, task.parse("3 1"))
    cross, decoder = map_blocks(probe, task, ("cross", "decoder"), written=True)
    out = [task.vocab.token(i) for i in probe.decoded]
    assert cross.queries[0] == f"<bos>→{out[0]}"  # row 0 reads <bos> and writes output 0
    assert cross.queries == decoder.queries and len(cross.queries) == len(out)
    assert "^ = <bos>" not in heatmap_legend([cross]).plain  # source tokens only
    assert "^ = <bos>" in heatmap_legend([decoder]).plain  # its columns start with ^
    assert map_blocks(probe, task, ("cross",))[0].queries[0] == "<bos>"  # TensorBoard's rows


def test_terminal_cells_carry_colour_when_the_console_has_it():
    model, task = untrained(1, 1)
    probe = run_probe(model, task, task.parse("3 1"))
    console = Console(file=io.StringIO(), width=80, color_system="truecolor", record=True)
    for renderable in attention_heatmaps(map_blocks(probe, task, ("encoder",))):
        console.print(renderable)
    assert "38;2;" in console.export_text(styles=True)  # 24-bit colours


# --- the command ---

def test_cli_writes_png_prints_prediction_and_alignment(quick_run):
    result = run_cli("visualize-attention", quick_run)
    assert result.exit_code == 0, result.stderr
    png = quick_run / "attention" / "best-step50.png"
    assert f"wrote {shown_path(png)}" in result.stdout and png_size(png)[0] > 300
    for needle in ("input:", "prediction:", "expected:", "cross-attention", "head 1",
                   "alignment score", "← best", "held-out argmax",
                   "rows: query tokens (decoder: token read → token written)"):
        assert needle in result.stdout, needle
    caption = " ".join(result.stdout.split())  # the caption wraps to the table's width
    assert "held-out argmax: share of the target positions of the same 200 held-out" in caption
    assert "encoder self-attention" not in result.stdout  # a bare --kind all: cross only
    assert "^ = <bos>" not in result.stdout  # no column of cross-attention is <bos>


def test_the_png_gives_each_cross_attention_head_its_alignment_scores(quick_run, tmp_path):
    from minitfm.lab.attention.visualize import visualize
    from minitfm.lab.loaded import load
    from minitfm.lab.options import VisualizeOptions

    report = visualize(load(quick_run), VisualizeOptions(out=tmp_path / "maps.png"))
    cross = next(b for b in report.blocks if b.kind == "cross")
    held_out, here = report.held_out_scores, report.scores
    assert cross.head_notes.shape == tuple(held_out.shape)
    assert cross.head_notes[0, 1].startswith(
        f"alignment {held_out[0, 1]:.2f} · here {here[0, 1]:.2f}")
    best = divmod(int(held_out.argmax()), held_out.size(1))
    assert [(0, h) for h in range(2) if cross.head_notes[0, h].endswith("← best")] == [best]
    fig = attention_figure(report.blocks, "title")
    titles = {ax.get_title() for ax in fig.get_axes()}
    assert f"layer 0 · head 1\n{cross.head_notes[0, 1]}" in titles
    assert texts_outside(fig) == []


def test_cli_honours_out_input_and_selection(quick_run, tmp_path):
    out = tmp_path / "sub" / "maps.png"
    result = run_cli("visualize-attention", quick_run, "--input", "3 1 4", "--kind", "encoder",
                     "--layer", "0", "--head", "1", "--out", out, "--checkpoint", "last")
    assert result.exit_code == 0, result.stderr
    assert out.is_file() and f"wrote {shown_path(out)}" in result.stdout
    assert "input:      3 1 4" in result.stdout and "expected:   3 1 4" in result.stdout
    assert "encoder self-attention" in result.stdout and "head 1" in result.stdout
    assert "head 0" not in result.stdout


def test_cli_no_terminal(quick_run, tmp_path):
    result = run_cli("visualize-attention", quick_run, "--no-terminal", "--out",
                     tmp_path / "a.png")
    assert result.exit_code == 0, result.stderr
    assert "← best" in result.stdout  # the alignment table is still there
    assert "cross-attention (query" not in result.stdout


@pytest.mark.parametrize("args,needles", [
    (["--layer", "1"], ["--layer (1)", "0..0"]),
    (["--layer", "-1"], ["--layer (-1)"]),
    (["--head", "2"], ["--head (2)", "0..1"]),
    (["--kind", "self"], ["--kind ('self')", "encoder, decoder, cross, all"]),
    (["--input", "3 x 4"], ["--input ('3 x 4')", "'x'"]),
    (["--checkpoint", "middle"], ["--checkpoint ('middle')"]),
    (["--out", "maps.jpg"], ["--out ('maps.jpg')", ".png"]),
])
def test_cli_errors_are_one_clean_line(quick_run, args, needles):
    result = run_cli("visualize-attention", quick_run, *args)
    assert_clean_error(result, 2, *needles)


def test_cli_run_without_checkpoints(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    result = run_cli("visualize-attention", tmp_path / "run")
    assert_clean_error(result, 2, "has no best checkpoint")


def test_help_documents_the_terminal_default():
    import re

    result = run_cli("visualize-attention", "--help")
    assert result.exit_code == 0
    text = re.sub(r"[\s│]+", " ", result.stdout)  # the help panel's lines joined again
    assert ("--terminal --no-terminal Also draw the heatmaps in the terminal; a bare --kind all "
            "draws only cross-attention there (the PNG has all kinds). [default: terminal]") in text
    assert "--force Replace the --out (and --gif) file even if it is not a picture minitfm " \
        "wrote." in text


@pytest.mark.parametrize("module", ["minitfm.lab.pictures", "minitfm.lab.attention.figures",
                                    "minitfm.lab.attention.lettering",
                                    "minitfm.lab.attention.mapgrid",
                                    "minitfm.lab.attention.over_training"])
def test_pictures_import_matplotlib_only_inside_functions(module):
    import ast
    import importlib
    import inspect

    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    top = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    names = [alias.name for node in top for alias in node.names] + \
        [node.module for node in top if isinstance(node, ast.ImportFrom)]
    assert not any(name and name.startswith("matplotlib") for name in names), names


def test_grid_pictures_read_the_font_map_only_for_characters_outside_font_has():
    """minitfm's own text (FONT_HAS) is all in DejaVu Sans, so a run's pictures need not import
    matplotlib to read its character map; any other character still gets that look."""
    from minitfm.lab.attention.lettering import FONT_HAS, font_path, glyphs
    from minitfm.lab.attention.mapgrid import MapGrid

    assert {ch for ch in FONT_HAS if ord(ch) not in glyphs(font_path())} == {"\n"}  # a break
    model, task = untrained(2, 2)
    src = task.parse("3 1 4")
    block = map_blocks(run_probe(model, task, src, teacher=task.target(src)), task,
                       ("cross",))[0]
    grid = MapGrid(block, "reverse · input 3 1 4 → target 4 1 3\n(colour ∝ √weight)",
                   "step 10 · output 4 1 3 ✓")
    grid.frame(block, "step 10 · output 4 1 3 ✓")
    assert grid.glyphs is None
    assert grid.lettering(["가"]).text("가") == "[U+AC00]" and grid.glyphs is not None
