"""Text minitfm writes where someone reads it (the fourth adversarial report's L6, L7, L9, M4).

One rule per place: on a terminal, control and format characters and the line and paragraph
separators come out escaped (`tables.printable`, `shell_quote`); `predict` prints one line per
input, its stdin split at "\\n" only; JSON is strict, a non-finite number written as null
(`files.to_json`); TensorBoard's markdown shows pairs text as text (`tb.markdown_text`).
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import unicodedata
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from minitfm.app.api import train_run
from minitfm.app.text import printable, shell_quote
from minitfm.config import load_config
from minitfm.errors import shown_path
from tests.helpers import TINY, run_cli
from tests.helpers import train_bare as train

FAST = [*[item for item in TINY if not item.startswith("log.attention_every")],
        "train.steps=20", "train.eval_every=10", "train.eval_samples=50",
        "log.tensorboard=false"]
BIDI_NAME = "report\u202efdp.exe"  # shows as "reportexe.pdf" where U+202E is printed raw


def strict_json(text: str):
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are no JSON."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def nan_weights(run_dir: Path) -> None:
    """Every weight of the run's checkpoints made NaN (predict, eval and explore still run)."""
    for path in (run_dir / "checkpoints").glob("*.pt"):
        state = torch.load(path, map_location="cpu", weights_only=True)
        for tensor in state["model"].values():
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
        torch.save(state, path)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("text") / "base"
    train(load_config(None, FAST), run_dir=run_dir)
    return run_dir


# --- L9: one rule for text that reaches a terminal ---

@pytest.mark.parametrize("text, shown", [
    ("plain é 漢字 😀", "plain é 漢字 😀"),
    ("a\x1b[31mb", "a\\x1b[31mb"),  # Cc
    ("a\nb\tc\x85", "a\\nb\\tc\\x85"),  # Cc, line breaks among them
    (BIDI_NAME, "report\\u202efdp.exe"),  # Cf: a bidi override
    ("a\u200fb\u2066c\ufeffd\u200be", "a\\u200fb\\u2066c\\ufeffd\\u200be"),  # Cf
    ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # Zl, Zp
])
def test_printable_escapes_control_and_format_characters_and_separators(text, shown):
    assert printable(text) == shown


@pytest.mark.parametrize("text", [BIDI_NAME, "runs/a\u2028b",
                                  "x\u200f\u2066\ufeffy\U000e0001"])
def test_shell_quote_escapes_format_characters_and_pastes_back(text):
    word = shell_quote(text)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in word), word
    echoed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True)
    assert echoed.stdout.decode("utf-8") == text


def test_a_bidi_run_name_prints_escaped_in_runs_and_training(base, tmp_path):
    """RU_bidi: `runs`, the `run directory:` line and the `next:` commands."""
    root = tmp_path / "runs"
    shutil.copytree(base, root / BIDI_NAME)
    listing = run_cli("runs", root)
    assert listing.exit_code == 0, listing.stderr
    assert "\u202e" not in listing.stdout and "report\\u202efdp.exe" in listing.stdout
    trained = run_cli("train", *FAST, "train.steps=2", "train.eval_every=0", "--run-dir",
                      tmp_path / f"new{BIDI_NAME}")
    assert trained.exit_code == 0, trained.stderr
    assert "\u202e" not in trained.stdout
    assert f"run directory: {printable(shown_path(tmp_path / f'new{BIDI_NAME}'))}" in trained.stdout
    assert shell_quote(shown_path(tmp_path / f"new{BIDI_NAME}")) in trained.stdout  # next:


# --- L7: the JSON minitfm prints is strict ---

def test_eval_json_of_a_nan_model_is_strict_json_with_null(base, tmp_path):
    """EV_json_nan."""
    run_dir = Path(shutil.copytree(base, tmp_path / "nan"))
    nan_weights(run_dir)
    result = run_cli("eval", run_dir, "--json", "--samples", "20")
    assert result.exit_code == 0, result.stderr
    report = strict_json(result.stdout)
    assert report["loss"] is None


def test_runs_json_of_an_infinite_wall_time_is_strict_json_and_the_run_unreadable(base,
                                                                                  tmp_path):
    """RU_json_inf: a hand-edited summary.json. An infinite wall_s is no time a run writes: the
    run is unreadable, saying why (round 5, M7), its wall time the metrics' (finite)."""
    run_dir = Path(shutil.copytree(base, tmp_path / "runs" / "inf"))
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "wall_s": float("inf")}))
    result = run_cli("runs", tmp_path / "runs", "--json")
    assert result.exit_code == 0, result.stderr
    [row] = strict_json(result.stdout)
    assert row["status"] == "unreadable" and "wall_s (inf) is not a number" in row["note"]
    assert row["wall_s"] is None or math.isfinite(row["wall_s"])


# --- M4: predict prints one line per input ---

@pytest.fixture(scope="module")
def newlines(tmp_path_factory) -> Path:
    """A char pairs run whose symbols include U+2028 and \\x1c, its targets newlines only (one
    per source character), so that its outputs hold newlines."""
    root = tmp_path_factory.mktemp("newlines")
    data = root / "pairs.jsonl"
    sources = ["".join(chars) for n in (2, 3) for chars in
               itertools.product("abcd\u2028\x1c", repeat=n)]
    data.write_text("".join(json.dumps({"source": s, "target": "\n" * len(s)}) + "\n"
                            for s in sources), encoding="utf-8")
    run_dir = root / "run"
    train(load_config(None, [
        "task.name=pairs", f"task.train_path={data}", "task.tokenize=char",
        "model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "model.d_ff=32", "model.max_len=16", "train.steps=40",
        "train.batch_size=32", "train.lr=0.01", "train.warmup_steps=5", "train.eval_every=40",
        "train.eval_samples=20", "log.tensorboard=false", "log.attention_every=0"]),
        run_dir=run_dir)
    return run_dir


@pytest.mark.parametrize("stdin, inputs", [
    ("ab\u2028c\nabc\n", ["ab\u2028c", "abc"]),  # PR_stdin_u2028
    ("ab\x1cc\nabc\n", ["ab\x1cc", "abc"]),  # PR_stdin_x1c
    ("a\x85b\nc\x0bd\x0ca\n", ["a\x85b", "c\x0bd\x0ca"]),  # other str.splitlines breaks
    ("a\rb\r\ncd\r\n", ["a\rb", "cd"]),  # a lone \r is a symbol; \r\n a line ending
    ("\ufeffab\n\nb\u2029c", ["ab", "b\u2029c"]),  # a BOM, a blank line, no final newline
])
def test_predict_splits_stdin_at_newlines_only(newlines, stdin, inputs):
    result = run_cli("predict", newlines, "--json", input=stdin)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["input"] for row in rows] == inputs
    plain = run_cli("predict", newlines, input=stdin)
    assert plain.stdout.count("\n") == len(inputs)


def test_predict_prints_an_output_holding_newlines_on_one_line(newlines):
    """PR_newline_out: one line per input, its newlines escaped; --json keeps them exact."""
    texts = ["abc", "bcd", "dab"]
    exact = run_cli("predict", newlines, "--json", *texts)
    outputs = [json.loads(line)["output"] for line in exact.stdout.splitlines()]
    assert any("\n" in output for output in outputs), outputs  # the case at hand
    plain = run_cli("predict", newlines, *texts)
    assert plain.exit_code == 0, plain.stderr
    assert plain.stdout.split("\n") == [printable(output) for output in outputs] + [""]
    piped = run_cli("predict", newlines, input="".join(f"{t}\n" for t in texts))
    assert piped.stdout == plain.stdout


def test_predict_refuses_stdin_that_is_not_utf8_in_one_line(newlines):
    from typer.testing import CliRunner

    from minitfm.app.cli import app

    result = CliRunner().invoke(app, ["predict", str(newlines)], input=b"ab\n\xff\xfe\n")
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith("error: stdin line 2: not UTF-8") and \
        result.stderr.count("\n") == 1, result.stderr


# --- L6: TensorBoard's samples table shows pairs text as text ---

class Cells(HTMLParser):
    """The rows of an HTML table, as the text of their cells; and the tags seen."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows, self.tags, self.cell = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


@pytest.mark.parametrize("text", [
    "a|b|c",  # would shift the columns
    '<img src="http://127.0.0.1:9/p.png">',  # would become a live remote image
    '<a href="https://example.org">x</a> &amp; *b* _i_ `c` [l](u) \\| #',
    "line\nbreak",  # would end the row
])
def test_tensorboard_samples_show_pairs_text_as_text(text):
    """TB_samples, through TensorBoard's own markdown renderer."""
    from tensorboard.plugin_util import markdown_to_safe_html

    from minitfm.lab.watch.tb import TensorBoardLogger

    logger = TensorBoardLogger()
    logger.task = type("Task", (), {"format": staticmethod(lambda tokens: tokens)})()
    table = logger._samples_table([(text, "t")], ["p"])
    cells = Cells()
    cells.feed(markdown_to_safe_html(table))
    assert "img" not in cells.tags and "a" not in cells.tags, cells.tags
    assert cells.rows == [["input", "target", "prediction", "ok"], [text, "t", "p", "no"]]


# --- a run that recorded attention: what explore and --over-training read ---

@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("recorded") / "run"
    train_run(load_config(None, [*FAST, "log.attention_every=eval"]), run_dir=run_dir)
    return run_dir


def test_attention_jsonl_of_a_nan_model_is_strict_json(recorded, tmp_path):
    """A NaN model's snapshot (alignment scores NaN) is written with null."""
    from minitfm.lab.attention.timeline import AttentionRecorder
    from minitfm.lab.loaded import load

    run_dir = Path(shutil.copytree(recorded, tmp_path / "nan"))
    nan_weights(run_dir)
    loaded = load(run_dir, "last", device="cpu")
    recorder = AttentionRecorder(loaded.task, loaded.held_out()[:8],
                                 run_dir / "attention.jsonl", active=True)
    recorder.write(recorder.take(loaded.step + 1, loaded.model))
    last = (run_dir / "attention.jsonl").read_text().splitlines()[-1]
    assert None in strict_json(last)["alignment"][0]
