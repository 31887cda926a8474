"""One rule for every picture minitfm writes (issue #29: L3, L4, L13).

An existing file is replaced only if minitfm wrote it (a PNG's `Software` text, a GIF's
comment) or with --force; a picture that cannot be written is refused in one line naming it
(exit 2) before anything is drawn; symbols without a glyph are drawn from another installed
font or labelled by code point, with at most one `note:` and no warning per glyph.
"""

from __future__ import annotations

import errno
import os
import unicodedata
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from matplotlib.text import Text
from PIL import Image

from minitfm.app.api import train_run as train  # with the attention recorder
from minitfm.config import load_config
from minitfm.errors import MinitfmError
from minitfm.lab.attention.figures import attention_figure
from minitfm.lab.attention.lettering import FONT, font_file, glyphs, lettering
from minitfm.lab.attention.probe import MapBlock
from minitfm.lab.pictures import is_minitfm_picture, save_png, write_picture
from tests.helpers import QUICK, assert_clean_error, run_cli

RECORDING = [item for item in QUICK if not item.startswith("log.attention_every")] + [
    "train.steps=20", "train.eval_every=10", "train.eval_samples=50",
    "train.target_exact_match=null", "log.tensorboard=false"]

# Every picture a command writes: (name, the command with {run} and {file}, the option, suffix)
PICTURES = [
    ("viz", ["visualize-attention", "{run}", "--no-terminal", "--out", "{file}"], "--out", "png"),
    ("ablate", ["ablate", "{run}", "--samples", "20", "--out", "{file}"], "--out", "png"),
    ("strip", ["visualize-attention", "{run}", "--over-training", "--out", "{file}"], "--out",
     "png"),
    ("gif", ["visualize-attention", "{run}", "--over-training", "--out", "{strip}", "--gif",
             "{file}"], "--gif", "gif"),
    ("plot", ["plot", "{run}", "--out", "{file}"], "--out", "png"),
    ("eval", ["eval", "{run}", "--samples", "20", "--plot", "{file}"], "--plot", "png"),
]
IDS = [name for name, *_ in PICTURES]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny copy run (20 steps) that recorded its attention at steps 10 and 20."""
    run_dir = tmp_path_factory.mktemp("pictures") / "run"
    train(load_config(None, RECORDING), run_dir=run_dir)
    return run_dir


def command(args: list[str], run_dir: Path, file: Path, folder: Path) -> list[str]:
    """`args` filled in: the picture at `file`, the GIF case's strip in `folder`."""
    return [a.format(run=run_dir, file=file, strip=folder / "strip.png") for a in args]


def users_picture(path: Path) -> bytes:
    """A real picture of the user's (no minitfm mark) at `path`; its bytes."""
    Image.new("RGB", (8, 8), "red").save(path)
    return path.read_bytes()


# --- L3: replace only what minitfm wrote, else --force ---

@pytest.mark.parametrize("name,args,option,suffix", PICTURES, ids=IDS)
def test_a_users_picture_is_replaced_only_with_force(run, tmp_path, name, args, option, suffix):
    file = tmp_path / f"mine.{suffix}"
    mine = users_picture(file)
    refused = run_cli(*command(args, run, file, tmp_path))
    assert_clean_error(refused, 2, f"{option} ('{file}') exists and is not a picture minitfm "
                                   f"wrote", "pass --force to replace it")
    assert file.read_bytes() == mine and not (tmp_path / "strip.png").exists()  # nothing drawn
    forced = run_cli(*command(args, run, file, tmp_path), "--force")
    assert forced.exit_code == 0, forced.stderr
    assert is_minitfm_picture(file)
    os.utime(file, ns=(0, 0))  # now minitfm's: replaced unasked
    again = run_cli(*command(args, run, file, tmp_path))
    assert again.exit_code == 0, again.stderr
    assert file.stat().st_mtime_ns != 0 and is_minitfm_picture(file)


def test_what_counts_as_minitfm_s_picture(tmp_path):
    users_picture(tmp_path / "a.png")
    users_picture(tmp_path / "a.gif")
    (tmp_path / "notes.png").write_text("minitfm")
    os.mkfifo(tmp_path / "fifo.png")  # never opened: it would block
    marked = Image.new("RGB", (4, 4))
    marked.save(tmp_path / "ours.gif", comment=b"minitfm")
    marked.save(tmp_path / "other.gif", comment=b"another tool")
    assert [is_minitfm_picture(tmp_path / n) for n in (
        "a.png", "a.gif", "notes.png", "fifo.png", "ours.gif", "other.gif", "none.png")] == [
        False, False, False, False, True, False, False]


# --- L4: a picture that cannot be written: one line naming it, before anything is drawn ---

def read_only(monkeypatch, folder: Path) -> None:
    """`folder` reads as on a read-only file system (root may write anywhere else, so the
    test asks os.access, as minitfm does)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if (
        Path(path) == folder and mode & os.W_OK) else real(path, mode, **kw))


@pytest.mark.parametrize("how", ["file", "read-only"])
@pytest.mark.parametrize("name,args,option,suffix", PICTURES, ids=IDS)
def test_an_unwritable_folder_is_refused_before_drawing(run, tmp_path, monkeypatch, how, name,
                                                        args, option, suffix):
    folder = tmp_path / "folder"
    if how == "file":
        folder.write_text("a file")
        file = folder / f"a.{suffix}"
        needles = [f"cannot write '{file}' ('{folder}' is a file, not a folder)"]
    else:
        folder.mkdir()
        read_only(monkeypatch, folder)
        file = folder / "sub" / f"a.{suffix}"
        needles = [f"cannot write '{file}' (its folder '{folder}' is read-only)"]
    before = sorted(tmp_path.rglob("*"))
    result = run_cli(*command(args, run, file, tmp_path))
    assert_clean_error(result, 2, *needles, f"choose another {option}")
    assert sorted(tmp_path.rglob("*")) == before  # no strip before a failing GIF, no folder


def test_a_failed_write_names_the_picture_and_leaves_no_temp_file(tmp_path):
    png = tmp_path / "a.png"
    rofs = OSError(errno.EROFS, "Read-only file system")
    with mock.patch("tempfile.mkstemp", side_effect=rofs):
        with pytest.raises(MinitfmError) as caught:
            write_picture(png, "--out", lambda buffer: buffer.write(b"new"))
    assert str(caught.value) == (f"cannot write '{png}' (Read-only file system): choose "
                                 f"another --out")
    # the cleanup failing too (the folder turned read-only midway) raises nothing of its own
    with mock.patch("os.fsync", side_effect=OSError(errno.EIO, "Input/output error")), \
            mock.patch.object(Path, "unlink", side_effect=rofs):
        with pytest.raises(MinitfmError, match=r"'.*a\.png' \(Input/output error\): choose "):
            write_picture(png, "--out", lambda buffer: buffer.write(b"new"))


def test_a_failed_write_in_the_cli_is_exit_2(run, tmp_path):
    png = tmp_path / "plot.png"
    with mock.patch("tempfile.mkstemp", side_effect=OSError(errno.EROFS, "Read-only file "
                                                                         "system")):
        result = run_cli("plot", run, "--out", png)
    assert_clean_error(result, 2, f"cannot write '{png}' (Read-only file system): choose "
                                  f"another --out")
    assert ".tmp" not in result.stderr and list(tmp_path.iterdir()) == []


# --- L13: symbols the font has no glyph for ---

def figure_texts(fig) -> list[str]:
    return [text.get_text() for text in fig.findobj(Text)]


def borrowed_symbol() -> str | None:
    """A letter FONT has no glyph for but a font matplotlib ships (STIX) has."""
    has, stix = glyphs(font_file(FONT)), glyphs(font_file("STIXGeneral"))
    found = [chr(c) for c in sorted(set(stix) - set(has))
             if unicodedata.category(chr(c)).startswith(("L", "S"))]
    return found[0] if found else None


def test_control_and_unassigned_characters_are_labelled_by_code_point(tmp_path):
    tokens = ["a", "\x1b", "\u0378", "x\ty"]  # ESC, an unassigned code point, a tab
    letters = lettering(["title\nline two", *tokens])
    assert letters.by_code_point >= {"\x1b", "\u0378", "\t"}
    assert [letters.token(t) for t in tokens] == ["a", "U+001B", "U+0378", "x[U+0009]y"]
    assert letters.text("title\nline two \x1b") == "title\nline two [U+001B]"
    assert letters.note() == ("the picture labels 3 symbols by code point (U+0009, U+001B, "
                              "U+0378): they are not printable (control or unassigned "
                              "characters)")
    block = MapBlock("cross", [0], [0], np.full((1, 1, 4, 4), 0.25), tokens, tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "Glyph ... missing" warning fails the test
        with letters.fonts():
            fig = attention_figure([letters.block(block)], letters.text("input \x1b"))
            save_png(fig, tmp_path / "a.png")
    assert {"U+001B", "U+0378", "x[U+0009]y"} <= set(figure_texts(fig))


def test_a_symbol_the_font_lacks_is_drawn_from_a_font_that_has_it(tmp_path):
    symbol = borrowed_symbol()
    if symbol is None:
        pytest.skip("this DejaVu Sans has every glyph of STIXGeneral")
    letters = lettering([f"input {symbol}", symbol])
    assert letters.fallbacks and symbol not in letters.by_code_point and letters.note() is None
    block = MapBlock("cross", [0], [0], np.full((1, 1, 1, 1), 1.0), [symbol], [symbol])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with letters.fonts():
            fig = attention_figure([letters.block(block)], letters.text(f"input {symbol}"))
            save_png(fig, tmp_path / "a.png")
    assert symbol in figure_texts(fig)


@pytest.fixture(scope="module")
def korean(tmp_path_factory):
    """A pairs run whose every source holds a Hangul syllable, ESC and an unassigned code point."""
    root = tmp_path_factory.mktemp("korean")
    syllables = [chr(0xAC00 + i) for i in range(12)]
    lines = [f"{a}\x1b{b}\u0378\t{b}{a}\n" for a in syllables for b in syllables]
    (root / "ko.tsv").write_text("".join(lines), encoding="utf-8")
    pairs = ["task.name=pairs", f"task.train_path={root / 'ko.tsv'}", "model.max_len=16"]
    keep = [item for item in RECORDING if not item.startswith("task.")]
    train(load_config(None, [*keep, *pairs]), run_dir=root / "run")
    return root / "run"


@pytest.mark.parametrize("args", [["--no-terminal"], ["--over-training", "--gif", "{tmp}/a.gif"]],
                         ids=["maps", "over-training"])
def test_symbols_without_glyphs_give_one_note_and_no_warnings(korean, tmp_path, recwarn, args):
    result = run_cli("visualize-attention", korean, *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 0, result.stderr
    assert not [w for w in recwarn if "Glyph" in str(w.message)]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: the picture labels "), lines
    assert "U+001B" in lines[0] and "U+0378" in lines[0]
