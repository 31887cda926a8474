"""Grading the learner's code, whatever it does: an endless loop is stopped and named, every error
names its file and line, a NaN is called a NaN; the Python API takes one name as one name."""

import json

import pytest

import minitfm
import minitfm.book.attention as book
from minitfm.learn import checks
from minitfm.learn.grading import check_function
from tests.helpers import run_cli


def start(folder):
    result = run_cli("learn", "start", folder)
    assert result.exit_code == 0, result.stderr
    return folder


def write_body(folder, chapter, blank_of, body):
    """The workbook's `chapter` with the blank of exercise `blank_of` (its raise line) replaced by
    `body`, indented as the raise was."""
    path = folder / f"{chapter}.py"
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines)
              if f"raise NotImplementedError('exercise {blank_of}" in line)
    indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
    lines[at:at + 1] = [indent + line for line in body.splitlines()]
    path.write_text("\n".join(lines) + "\n")
    return at + 1  # the body's first line


def test_an_exercise_that_never_returns_is_stopped_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "TIME_LIMIT_S", 0.2)
    monkeypatch.chdir(tmp_path)
    folder = start(tmp_path / "workbook")
    line = write_body(folder, "attention", "1 (attention)", "while True:\n    pass")
    result = run_cli("learn", "check", "workbook", "attention")
    assert result.exit_code == 1, result.stderr
    assert "attention did not return within 0.2 s: an endless loop?" in result.stdout
    assert f"workbook/attention.py:{line}" in result.stdout  # where it was going round

    def loops(q, k, v, mask=None, bias=None, dropout=None):
        while True:
            pass

    grade = check_function("attention", loops)
    assert grade.status == "failed" and "did not return within 0.2 s" in grade.message


def test_an_endless_fix_in_the_bug_zoo_is_not_fixed(tmp_path, monkeypatch):
    from minitfm.learn import zoo
    from minitfm.learn.workbook import load_workbook

    monkeypatch.setattr(checks, "TIME_LIMIT_S", 0.2)
    folder = tmp_path / "bugs"
    zoo.write_zoo(folder)
    path = folder / "model.py"
    path.write_text(path.read_text().replace(
        "    return torch.ones(size, size, dtype=torch.bool, device=device).tril(1)",
        "    while True:\n        pass", 1))
    results = dict((bug.id, fixed) for bug, fixed in zoo.check_zoo(load_workbook(folder)))
    assert results["causal-mask-leak"] is False


def test_the_limit_leaves_no_alarm_behind():
    """The limit is an alarm signal, set and cleared around each exercise: nothing waits on it."""
    import signal

    assert check_function("attention", book.attention).status == "passed"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, signal.default_int_handler)


def test_a_recognised_runtime_error_names_its_file_and_line_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = start(tmp_path / "workbook")
    line = write_body(folder, "layers", "4 (LayerNorm.forward)",
                      "centred = x - x.mean(-1)\n"
                      "return self.weight * centred / (centred.pow(2).mean(-1) + self.eps).sqrt()"
                      " + self.bias")
    result = run_cli("learn", "check", "workbook", "LayerNorm.forward", "--json")
    row = json.loads(result.stdout.splitlines()[0])
    assert row["status"] == "failed" and "keepdim=True" in row["hint"], row
    assert row["message"].startswith(f"workbook/layers.py:{line}: RuntimeError: "), row
    write_body(folder, "model", "2 (subsequent_mask)", "return torch.sqroot(size)")
    result = run_cli("learn", "check", "workbook", "subsequent_mask", "--json")
    row = json.loads(result.stdout.splitlines()[0])
    assert row["message"].startswith("workbook/model.py:"), row  # relative, not absolute
    assert "AttributeError" in row["message"], row


def test_a_nan_output_is_called_a_nan():
    def nan_attention(q, k, v, mask=None, bias=None, dropout=None):
        out, weights = book.attention(q, k, v, mask, bias, dropout)
        return out * float("nan"), weights

    grade = check_function("attention", nan_attention)
    assert grade.status == "failed"
    assert "NaN where the expected values are finite" in grade.message, grade.message
    assert "inf" not in grade.message, grade.message


@pytest.mark.parametrize("names", ["attention", ["attention"], ("attention",)])
def test_check_workbook_takes_one_name_as_a_list_of_one(tmp_path, names):
    folder = start(tmp_path / "workbook")
    rows = minitfm.check_workbook(folder, names)
    assert [row["exercise"] for row in rows] == ["attention"]



def test_the_docs_state_the_time_limit():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "learn.md").read_text()
    assert f"still running after {checks.TIME_LIMIT_S:g} s is stopped" in " ".join(docs.split())
