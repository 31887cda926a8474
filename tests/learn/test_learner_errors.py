"""Errors from the learner's code: whatever a workbook raises (sys.exit, a BaseException of its
own, an exception whose message fails, a KeyboardInterrupt) is a failed grade in `learn check`
and one line naming its file and line everywhere else (train, the lab commands, the Python
API); its print() never mixes into --json; importing it leaves no bytecode and reads none."""

import importlib.util
import json
import os
import py_compile
import re
import sys

import pytest

import minitfm
from minitfm.errors import MinitfmError, shown_path
from minitfm.learn.workbook import BOOK_IMPORT, book_source, load_workbook
from tests.helpers import assert_error_line, run_cli
from tests.learn.test_workbook import SHORT, start

BLANK = re.compile(r"^( *)raise NotImplementedError\('exercise 1 \(attention\).*$", re.M)
BOOKS_BODY = """d_k = q.size(-1)
scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
if bias is not None:
    scores = scores + bias
if mask is not None:
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
weights = scores.softmax(dim=-1)
dropped = weights if dropout is None else dropout(weights)
return dropped @ v, weights"""
OWN_BASE = "class Stop(BaseException):\n    pass\nraise Stop('mine')"
BAD_STR = ("class Bad(Exception):\n    def __str__(self):\n        raise ValueError('no')\n"
           "raise Bad()")


def attention_body(folder, body: str):
    """`folder`, a new workbook whose attention() (exercise 1) is `body`; the line of the
    body's first line."""
    start(folder)
    path = folder / "attention.py"
    text = path.read_text()
    found = BLANK.search(text)
    lines = "\n".join(found.group(1) + line for line in body.splitlines())
    path.write_text(text[:found.start()] + lines + text[found.end():])
    return folder, text[:found.start()].count("\n") + 1


def module_line(folder, chapter: str, code: str) -> int:
    """`code` put after the `from __future__` line of a chapter; its line number."""
    path = folder / f"{chapter}.py"
    lines = path.read_text().splitlines(keepends=True)
    at = next(n for n, line in enumerate(lines) if line.startswith("from __future__")) + 1
    path.write_text("".join(lines[:at] + [code + "\n"] + lines[at:]))
    return at + 1


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lab") / "run"
    result = run_cli("train", *SHORT, "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    return run_dir


# --- M1-M3: what the learner's code raises ---

def test_sys_exit_in_the_learners_code_is_a_failure_never_exit_0(tmp_path, lab_run):
    folder, line = attention_body(tmp_path / "wb", "import sys\nsys.exit(0)")
    where = f"{folder / 'attention.py'}:{line + 1}"
    checked = run_cli("learn", "check", folder, "attention")
    assert checked.exit_code == 1, checked.stdout + checked.stderr
    shown = f"{shown_path(folder / 'attention.py')}:{line + 1}"  # as `learn check` prints paths
    assert "your code called sys.exit(0)" in checked.stdout and shown in checked.stdout
    assert_error_line(run_cli("train", *SHORT, "--book", folder, "--run-dir",
                               tmp_path / "run"), 2, where, "your code called sys.exit(0)")
    assert_error_line(run_cli("predict", lab_run, "1 2 3", "--book", folder), 2, where,
                       "your code called sys.exit(0)")
    imported = start(tmp_path / "imported")
    line = module_line(imported, "layers", "import sys; sys.exit(0)")
    assert_error_line(run_cli("learn", "check", imported), 2,
                       f"{imported / 'layers.py'}:{line}", "your code called sys.exit(0)")


@pytest.mark.parametrize("body, needle", [(OWN_BASE, "Stop: mine"),
                                          (BAD_STR, "Bad (its message could not be shown")])
def test_an_exception_of_any_kind_is_one_line(tmp_path, lab_run, body, needle):
    """A BaseException of the learner's own, and an exception whose str() fails."""
    folder, line = attention_body(tmp_path / "wb", body)
    checked = run_cli("learn", "check", folder, "attention", "--json")
    assert checked.exit_code == 1, checked.stdout + checked.stderr
    [row] = [json.loads(text) for text in checked.stdout.splitlines()]
    assert row["status"] == "failed" and needle in row["message"], row
    for result in (run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run"),
                   run_cli("eval", lab_run, "--samples", "5", "--book", folder)):
        assert_error_line(result, 2, f"{folder / 'attention.py'}:", needle)
    imported = start(tmp_path / "imported")
    module_line(imported, "layers", body)
    assert_error_line(run_cli("learn", "check", imported), 2,
                       f"{imported / 'layers.py'}:", needle)


def test_a_keyboard_interrupt_raised_by_code_is_no_ctrl_c(tmp_path):
    folder, line = attention_body(tmp_path / "wb", "raise KeyboardInterrupt")
    result = run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run")
    assert_error_line(result, 2, f"{folder / 'attention.py'}:{line}", "KeyboardInterrupt")
    assert "Ctrl-C" not in result.stderr
    checked = run_cli("learn", "check", folder, "attention", "--json")
    assert checked.exit_code == 1 and "Ctrl-C" not in checked.stderr
    assert json.loads(checked.stdout)["status"] == "failed"


# --- M4: the lab commands and the Python API under --book ---

@pytest.mark.parametrize("command", [
    ["eval", "--samples", "5"], ["predict", "1 2 3"], ["visualize-attention", "--no-terminal"],
    ["ablate", "--samples", "5"], ["explain", "--samples", "5"], ["patch"]])
def test_an_error_in_the_learners_code_in_a_lab_command_is_one_line(tmp_path, lab_run,
                                                                    command):
    folder, line = attention_body(tmp_path / "wb", "raise RuntimeError('my bug')")
    result = run_cli(command[0], lab_run, *command[1:], "--book", folder)
    assert_error_line(result, 2, f"{folder / 'attention.py'}:{line}",
                       "RuntimeError: my bug", "minitfm learn check")


def test_an_error_in_the_learners_code_from_python_is_a_minitfm_error(tmp_path, lab_run):
    folder, line = attention_body(tmp_path / "wb", "raise RuntimeError('my bug')")
    with pytest.warns(UserWarning):  # the run trained another code than this workbook's
        run = minitfm.load_run(lab_run, book=folder)
    with pytest.raises(MinitfmError, match=re.escape(f"attention.py:{line}")):
        run.predict("1 2 3")


# --- L1: --json stays JSON ---

def test_the_learners_print_goes_to_stderr_under_json(tmp_path, lab_run):
    folder, _ = attention_body(tmp_path / "wb", "print('x' * 30)\n" + BOOKS_BODY)
    checked = run_cli("learn", "check", folder, "--json")
    assert checked.exit_code == 0, checked.stderr
    assert all(json.loads(line) for line in checked.stdout.splitlines())
    assert "x" * 30 in checked.stderr
    evaluated = run_cli("eval", lab_run, "--samples", "5", "--json", "--book", folder)
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["exact_match"] >= 0


# --- L3, item 9, resume: what train says of the workbook ---

def test_a_nan_from_the_learners_code_names_the_workbook(tmp_path):
    folder, _ = attention_body(tmp_path / "wb", "return torch.full_like(q @ k.transpose(-2, -1) "
                               "@ v, float('nan')), (q @ k.transpose(-2, -1)).softmax(-1)")
    result = run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run")
    assert result.exit_code == 1
    assert "loss became nan at step 1" in result.stderr
    assert f"or your code: minitfm learn check {folder}" in result.stderr


def test_train_names_the_exercises_that_fail_their_check(tmp_path):
    folder, _ = attention_body(tmp_path / "wb", BOOKS_BODY.replace(" / math.sqrt(d_k)", ""))
    result = run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "fails its check" in line]
    assert notes == [f"note: your attention fails its check (minitfm learn check {folder} "
                     f"attention says why)"], result.stderr
    fresh = start(tmp_path / "fresh")
    result = run_cli("train", *SHORT, "--book", fresh, "--run-dir", tmp_path / "fresh-run")
    assert result.exit_code == 0 and "fails its check" not in result.stderr


def test_resume_says_the_workbook_changed_since_the_run_trained(tmp_path):
    folder = start(tmp_path / "wb")
    run_dir = tmp_path / "run"
    assert run_cli("train", *SHORT, "--book", folder, "--run-dir", run_dir).exit_code == 0
    same = run_cli("train", "--resume", run_dir, "train.steps=8", "--book", folder)
    assert same.exit_code == 0 and "changed since" not in same.stderr
    text = BOOK_IMPORT.sub(r"from .\1 import", book_source("attention"))
    (folder / "attention.py").write_text(text)
    result = run_cli("train", "--resume", run_dir, "train.steps=10", "--book", folder)
    assert result.exit_code == 0, result.stderr
    assert f"note: the workbook {folder} has changed since this run trained" in result.stderr


# --- L8, L12: importing a workbook ---

def test_importing_a_workbook_writes_no_bytecode_and_reads_none(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    folder = start(tmp_path / "wb")
    assert run_cli("learn", "check", folder).exit_code == 0
    assert run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run").exit_code == 0
    assert not (folder / "__pycache__").exists()
    # A chapter swapped for another of the same size and time: its source runs, not a stale
    # .pyc of the first (which Python would trust by size and time).
    path = folder / "layers.py"
    stamp = path.stat().st_mtime_ns
    first = path.read_text()
    path.write_text(first + "WHICH = 1\n")
    os.utime(path, ns=(stamp, stamp))
    py_compile.compile(str(path), importlib.util.cache_from_source(str(path)))
    path.write_text(first + "WHICH = 2\n")
    os.utime(path, ns=(stamp, stamp))
    assert load_workbook(folder).modules["layers"].WHICH == 2


def test_errors_python_finds_at_import_name_their_own_file_and_line(tmp_path):
    folder = start(tmp_path / "wb")
    path = folder / "layers.py"
    lines = path.read_text().splitlines(keepends=True)
    at = next(n for n, line in enumerate(lines) if line.startswith("from __future__"))
    path.write_text("".join(lines[:at] + ["x = 1\n"] + lines[at:]))
    assert_error_line(run_cli("learn", "check", folder), 2, f"{path}:{at + 2}:",
                       "from __future__ imports must occur at the beginning of the file")
    lines[4] = "x = 1  \0\n"
    path.write_text("".join(lines))
    assert_error_line(run_cli("learn", "check", folder), 2, f"{path}:5:", "null bytes")
