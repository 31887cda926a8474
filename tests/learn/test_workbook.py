"""`minitfm learn start` and `check`, and training with a workbook: the learner's code runs,
the book's fills in, errors are one line, and a run folder never makes minitfm import code."""

import json
import re

import pytest

from minitfm.learn.exercises import CHAPTERS, EXERCISES
from minitfm.learn.workbook import BOOK_IMPORT, MARK, book_source, load_workbook
from minitfm.run.checkpoint import load_checkpoint
from tests.helpers import TINY, assert_clean_error, assert_error_line, run_cli

SHORT = [*TINY, "train.steps=6", "train.warmup_steps=2", "train.eval_every=3",
         "train.eval_samples=20", "log.tensorboard=false"]


def start(folder):
    result = run_cli("learn", "start", folder)
    assert result.exit_code == 0, result.stderr
    return folder


def write_book_chapter(folder, chapter, change=lambda text: text):
    """The book's own chapter in the workbook (every exercise of it written), changed."""
    text = BOOK_IMPORT.sub(r"from .\1 import", book_source(chapter))
    (folder / f"{chapter}.py").write_text(change(text), encoding="utf-8")


def test_start_writes_the_chapters_with_blank_exercises(tmp_path):
    folder = start(tmp_path / "workbook")
    assert {p.name for p in folder.iterdir()} == {f"{c}.py" for c in CHAPTERS} | {
        "__init__.py", "README.md", MARK}
    text = (folder / "attention.py").read_text()
    assert "def attention(q: Tensor, k: Tensor, v: Tensor" in text  # the book's signature
    assert "softmax(Q K^T / sqrt(d_k) + bias) V" in text  # and docstring
    assert "raise NotImplementedError('exercise 1 (attention)" in text
    assert "from .layers import Dropout" in text  # the workbook's own chapters
    assert all(e.name in (folder / "README.md").read_text() for e in EXERCISES)
    workbook = load_workbook(folder)
    assert workbook.written == () and workbook.kind == "workbook"


def test_an_existing_folder_is_never_written_over(tmp_path):
    folder = start(tmp_path / "workbook")
    (folder / "attention.py").write_text("# my work\n")
    assert_clean_error(run_cli("learn", "start", folder), 2, "already exists",
                       "never writes over")
    assert (folder / "attention.py").read_text() == "# my work\n"


def test_a_fresh_workbook_checks_as_not_started_and_the_book_as_passed(tmp_path):
    folder = start(tmp_path / "workbook")
    result = run_cli("learn", "check", folder, "--json")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["exercise"] for r in rows] == [e.name for e in EXERCISES]
    assert {r["status"] for r in rows} == {"not started"}
    assert set(rows[0]) >= {"exercise", "file", "function", "status", "hint"}
    for chapter in CHAPTERS:
        write_book_chapter(folder, chapter)
    result = run_cli("learn", "check", folder, "--json")
    statuses = {json.loads(line)["status"] for line in result.stdout.splitlines()}
    assert result.exit_code == 0 and statuses == {"passed"}, result.stdout


def test_a_failing_exercise_exits_1_with_its_check_and_hint(tmp_path):
    folder = start(tmp_path / "workbook")
    write_book_chapter(folder, "attention",
                       lambda text: text.replace(" / math.sqrt(d_k)  # (B, H, T_q, T_k)", ""))
    result = run_cli("learn", "check", folder, "attention")
    assert result.exit_code == 1
    assert "attention (attention.py) fails" in result.stdout
    assert "the scaling by 1/sqrt(d_k) is missing" in result.stdout


@pytest.mark.parametrize("change, needle", [
    (lambda t: t.replace("def attention(", "def attention(:"), r"attention\.py:\d+: syntax error"),
    (lambda t: t.replace("def attention(", "def attend("), "has no attention"),
    (lambda t: t + "\nundefined_name\n", r"attention\.py:\d+: NameError"),
])
def test_a_workbook_that_does_not_import_is_one_line_naming_file_and_line(tmp_path, change,
                                                                           needle):
    folder = start(tmp_path / "workbook")
    write_book_chapter(folder, "attention", change)
    result = run_cli("learn", "check", folder)
    assert_clean_error(result, 2)
    assert re.search(needle, result.stderr), result.stderr
    assert_clean_error(run_cli("train", *SHORT, "--book", folder, "--run-dir",
                               tmp_path / "run"), 2)
    assert not (tmp_path / "run").exists()


def test_no_workbook_is_refused_in_one_line(tmp_path, monkeypatch):
    assert_clean_error(run_cli("learn", "check", tmp_path / "nothing"), 2, "does not exist",
                       "minitfm learn start")
    assert_clean_error(run_cli("learn", "check", tmp_path), 2, "is no minitfm workbook",
                       "in a new folder")  # never `learn start` on a folder that exists
    (tmp_path / "notes.txt").write_text("")
    assert_clean_error(run_cli("learn", "check", tmp_path / "notes.txt"), 2, "is a file")
    assert_clean_error(run_cli("learn", "check", tmp_path, "atention"), 2,
                       "'atention' is not an exercise (did you mean 'attention'?)")
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("learn", "check", "attention"), 2,
                       "'attention' is an exercise, not a folder",
                       "minitfm learn check workbook attention")
    assert_clean_error(run_cli("train", *SHORT, "model.code=nowhere"), 2,
                       "model.code", "neither fast nor book nor a workbook folder")


def test_training_runs_the_learners_functions_and_says_whose_is_whose(tmp_path):
    folder = start(tmp_path / "workbook")
    write_book_chapter(folder, "attention", lambda text: text.replace(
        "    weights = scores.softmax(dim=-1)  #",
        "    CALLS.append(1)\n    weights = scores.softmax(dim=-1)  #").replace(
        "\ndef attention(", "\nCALLS = []\n\n\ndef attention("))
    result = run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    assert f"code workbook {folder}" in result.stdout
    assert "your code: attention, MultiHeadAttention.forward, KVCache.append;" in result.stdout
    assert load_workbook(folder).modules["attention"].CALLS  # the learner's attention ran
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert saved["config"]["model"]["code"] == str(folder)
    assert saved["workbook"]["learner"] == ["attention", "MultiHeadAttention.forward",
                                            "KVCache.append"]
    assert len(saved["workbook"]["sha256"]) == 64


def test_an_error_in_the_learners_code_is_one_line_naming_it(tmp_path):
    folder = start(tmp_path / "workbook")
    write_book_chapter(folder, "layers", lambda text: text.replace(
        "        hidden = torch.relu(self.linear1(x))  # (..., F)",
        "        hidden = torch.relu(self.linear1(x.t()))  # (..., F)"))
    result = run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run")
    assert_error_line(result, 2)  # after a note: the exercise fails its check too
    assert result.stderr.startswith("note: your FeedForward.forward fails its check")
    assert re.search(r"layers\.py:\d+ in forward: RuntimeError", result.stderr), result.stderr
    assert "minitfm learn check" in result.stderr


def test_a_run_folder_never_makes_minitfm_import_its_workbook(tmp_path):
    folder = start(tmp_path / "workbook")
    run_dir = tmp_path / "run"
    assert run_cli("train", *SHORT, "--book", folder, "--run-dir", run_dir).exit_code == 0
    evaluated = run_cli("eval", run_dir, "--samples", "20")
    assert evaluated.exit_code == 0, evaluated.stderr
    assert f"give --book {folder}" in evaluated.stderr  # the book's code ran, and it says so
    with_book = run_cli("eval", run_dir, "--samples", "20", "--book", folder)
    assert with_book.exit_code == 0 and "give --book" not in with_book.stderr
    resumed = run_cli("train", "--resume", run_dir, "train.steps=8")
    assert resumed.exit_code == 0, resumed.stderr
    assert "goes on with the book's code" in resumed.stderr
    assert ", code book, device" in resumed.stdout


def test_the_book_changed_since_the_workbook_was_made(tmp_path):
    folder = start(tmp_path / "workbook")
    mark = json.loads((folder / MARK).read_text())
    mark["book"]["attention"] = "0" * 16  # as if the book's attention had been edited since
    (folder / MARK).write_text(json.dumps(mark))
    result = run_cli("learn", "check", folder)
    assert result.exit_code == 0
    assert "the book has changed since this workbook was made, in attention" in result.stderr


@pytest.mark.slow
def test_a_workbook_holding_the_books_code_reaches_the_default_target(tmp_path):
    """The default config, trained with a workbook whose every exercise is written (the book's
    code, in the workbook's files): the learner's path ends where the book's does."""
    folder = start(tmp_path / "workbook")
    for chapter in CHAPTERS:
        write_book_chapter(folder, chapter)
    run_dir = tmp_path / "run"
    result = run_cli("train", "--book", folder, "threads=1", "log.tensorboard=false",
                     "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    assert "your code: attention, subsequent_mask," in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    # The default's runs reach 99% at steps 220-240 of 240: one that reaches it at its last
    # step has "finished" (every step run), not "stopped at target"; both reached it.
    assert summary["status"] in ("stopped at target", "finished"), summary["status"]
    assert summary["best_exact_match"] >= 0.99, summary["best_exact_match"]


def test_a_function_that_calls_itself_fails_and_a_half_written_one_says_why(tmp_path):
    """Graded alone, an exercise's own name is the learner's: calling it recurses (in a run it
    would too), instead of passing on the book's."""
    folder = start(tmp_path / "workbook")
    text = (folder / "model.py").read_text()
    start_at = text.index("def subsequent_mask(")
    end_at = text.index("raise NotImplementedError", start_at)
    line_end = text.index("\n", end_at)
    text = text[:end_at] + "return subsequent_mask(size, device)" + text[line_end:]
    (folder / "model.py").write_text(text)
    hint = "        # Hint: per position over the last dim"
    layers = (folder / "layers.py").read_text().replace(
        hint, "        centred = x - x.mean(-1, keepdim=True)\n" + hint)
    (folder / "layers.py").write_text(layers)
    result = run_cli("learn", "check", folder, "--json")
    rows = {json.loads(line)["exercise"]: json.loads(line) for line in result.stdout.splitlines()}
    assert rows["subsequent_mask"]["status"] == "failed"
    assert "calls itself" in rows["subsequent_mask"]["hint"]
    assert rows["LayerNorm.forward"]["status"] == "failed"
    assert "still raises NotImplementedError" in rows["LayerNorm.forward"]["message"]


def test_check_from_inside_the_workbook_and_where_to_go_next(tmp_path, monkeypatch):
    folder = start(tmp_path / "workbook")
    monkeypatch.chdir(folder)
    result = run_cli("learn", "check")
    assert result.exit_code == 0, result.stderr
    assert "0 of 15 passed; next: attention (attention.py:" in result.stdout


def test_an_exercise_named_first_from_inside_the_workbook_is_checked(tmp_path, monkeypatch):
    """`cd workbook && minitfm learn check attention` checks that exercise, as the bare form
    checks them all; from the folder above, `learn check attention` checks ./workbook's."""
    folder = start(tmp_path / "workbook")
    write_book_chapter(folder, "attention")
    for where in (folder, tmp_path):
        monkeypatch.chdir(where)
        result = run_cli("learn", "check", "attention", "--json")
        assert result.exit_code == 0, result.stderr
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        assert [(r["exercise"], r["status"]) for r in rows] == [("attention", "passed")]
        result = run_cli("learn", "check", "attention", "KVCache.append", "--json")
        assert [json.loads(line)["exercise"] for line in result.stdout.splitlines()] == [
            "attention", "KVCache.append"]
