"""A workbook's files, whatever is in them: `learn start` and `learn bugs` leave a whole folder or
none, a mark or a chapter that is odd (nested, a FIFO, with a byte-order mark, a zoo's mark on
a workbook) is one line or is read, never a traceback or a hang."""

import json
import os
import signal
import sys

import pytest

from minitfm.learn import workbook as workbook_module
from minitfm.learn.workbook import MARK, load_workbook
from tests.helpers import TINY, assert_clean_error, run_cli

NOT_UTF8 = os.fsdecode(b"wb\xe9")  # a Latin-1 name: Python holds the byte as a lone surrogate


def start(folder):
    result = run_cli("learn", "start", folder)
    assert result.exit_code == 0, result.stderr
    return folder


@pytest.mark.parametrize("command", ["start", "bugs"])
def test_a_write_that_fails_midway_leaves_nothing(tmp_path, monkeypatch, command):
    written = []
    real = workbook_module.Path.write_text

    def full_disk(path, text, *args, **kwargs):
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(path)
        return real(path, text, *args, **kwargs)

    monkeypatch.setattr(workbook_module.Path, "write_text", full_disk)
    folder = tmp_path / "deep" / "wb"
    assert_clean_error(run_cli("learn", command, folder), 2, "No space left on device")
    assert len(written) == 2 and not (tmp_path / "deep").exists(), list(tmp_path.rglob("*"))
    monkeypatch.undo()
    start(folder) if command == "start" else run_cli("learn", "bugs", folder)
    assert (folder / MARK).is_file()  # nothing was left in the way


@pytest.mark.slow
def test_a_full_disk_leaves_no_half_workbook(tmp_path):
    """As the report found it: `ulimit -f 8` (8 blocks of 512 bytes) and `learn start`."""
    import subprocess

    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
              "from minitfm.app.cli import app; sys.argv = ['minitfm', 'learn', 'start', "
              "sys.argv[1]]; app()")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "wfull")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "File too large" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["start", "bugs"])
def test_a_name_that_is_not_utf8_is_refused_up_front(tmp_path, command):
    folder = tmp_path / NOT_UTF8
    assert_clean_error(run_cli("learn", command, folder), 2, "is not a UTF-8 name")
    assert list(tmp_path.iterdir()) == []


def test_training_a_workbook_whose_name_is_not_utf8_is_one_line_in_minitfms_words(tmp_path):
    folder = start(tmp_path / "wb")
    folder.rename(tmp_path / NOT_UTF8)
    result = run_cli("train", *TINY, "--book", tmp_path / NOT_UTF8)
    assert_clean_error(result, 2, "model.code", "is not a UTF-8 name")
    assert "unicode string" not in result.stderr


def test_a_deeply_nested_mark_is_no_valid_mark(tmp_path):
    folder = start(tmp_path / "wb")
    (folder / MARK).write_text('{"kind": "workbook", "book": {"a": ' + "[" * 100_000
                               + "]" * 100_000 + "}}")
    assert_clean_error(run_cli("learn", "check", folder), 2, f"no valid {MARK}")


@pytest.mark.parametrize("name", [MARK, "layers.py"])
def test_a_fifo_as_the_mark_or_a_chapter_is_one_line_not_a_hang(tmp_path, name):
    folder = start(tmp_path / "wb")
    (folder / name).unlink()
    os.mkfifo(folder / name)

    def hung(signum, frame):
        raise AssertionError(f"learn check hangs on a FIFO as {name}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        result = run_cli("learn", "check", folder)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert_clean_error(result, 2, "not a regular file" if name != MARK else f"no valid {MARK}")


def test_a_chapter_saved_with_a_byte_order_mark_is_read(tmp_path):
    folder = start(tmp_path / "wb")
    path = folder / "layers.py"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    result = run_cli("learn", "check", folder)
    assert result.exit_code == 0, result.stderr
    assert "0 of 15 passed" in result.stdout


def test_a_blank_workbook_marked_as_a_zoo_is_refused(tmp_path):
    folder = start(tmp_path / "wb")
    mark = json.loads((folder / MARK).read_text())
    (folder / MARK).write_text(json.dumps({**mark, "kind": "zoo"}))
    result = run_cli("learn", "check", folder)
    assert_clean_error(result, 2, "marked as a bug zoo", "blank exercises", '"kind": "workbook"')
    assert "bugs fixed" not in result.stdout
    with pytest.raises(workbook_module.WorkbookError):
        load_workbook(folder)
