"""Who runs what code: minitfm imports a learner's code only from a folder named on the
command line (`--book DIR`, a `model.code=DIR` override, `learn check DIR`, or the workbook
`learn check` finds where it is run), only when that folder and its chapters are the user's own
and nobody else may write them (how each file is read and checked: test_trust_reading.py); a
config file never makes it import one; and the processes minitfm starts never import modules
from the working folder."""

import grp
import os
import pwd
import re
import shlex
import stat
import sys

import pytest

import minitfm
from minitfm.errors import MinitfmError, shown_path
from minitfm.lab.many.scheduler import train_command
from minitfm.lab.many.sweep import prepare
from minitfm.lab.options import SweepOptions
from tests.helpers import TINY, assert_clean_error, assert_error_line, run_cli
from tests.learn.test_workbook import SHORT, start


def planted(folder, canary):
    """`folder`'s attention.py, changed so that importing it creates the file `canary`."""
    path = folder / "attention.py"
    text = path.read_text()
    line = "from __future__ import annotations\n"
    path.write_text(text.replace(line, f"{line}open({str(canary)!r}, 'a').close()\n", 1))
    return folder


def config_naming(path, code):
    """A config file of the SHORT settings whose model.code is `code`, as written."""
    sections = {}
    for item in [*SHORT, f"model.code={code}"]:  # a key given twice: the last value
        key, value = item.split("=", 1)
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    path.write_text("".join(f"{section}:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items())
                            for section, keys in sections.items()))
    return path


# --- learn check: which folder, and whose ---

def test_learn_check_without_a_folder_says_it_checks_the_current_one(tmp_path, monkeypatch):
    monkeypatch.chdir(start(tmp_path / "workbook"))
    result = run_cli("learn", "check")
    assert result.exit_code == 0, result.stderr
    assert "note: checking the workbook in the current folder" in result.stderr


def test_learn_check_refuses_a_folder_of_another_user(tmp_path, monkeypatch):
    folder = planted(start(tmp_path / "shared"), tmp_path / "CANARY")
    monkeypatch.chdir(folder)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(folder).st_uid + 1)  # as someone else
    result = run_cli("learn", "check")
    assert result.exit_code == 2 and "Traceback" not in result.stdout + result.stderr
    note, error = result.stderr.splitlines()
    assert note == "note: checking the workbook in the current folder"
    assert error.startswith(f"error: {folder} belongs to ") and "not to you" in error
    assert f"(uid {os.stat(folder).st_uid})" in error and f"cp -r {folder} mine" in error
    assert not (tmp_path / "CANARY").exists()
    assert_clean_error(run_cli("learn", "check", folder), 2, "not to you")
    trained = run_cli("train", *SHORT, "--book", folder, "--run-dir", tmp_path / "run")
    assert_error_line(trained, 2, "not to you")  # (after a warning: whose thread registry)
    assert not (tmp_path / "CANARY").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("writable", ["", "attention.py", "__init__.py", "layers.py"])
def test_a_workbook_others_may_write_is_never_imported(tmp_path, writable):
    folder = planted(start(tmp_path / "workbook"), tmp_path / "CANARY")
    path = folder / writable
    path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWOTH)
    result = run_cli("learn", "check", folder)
    assert_clean_error(result, 2, "writable by others", f"chmod go-w {path}")
    assert stat.filemode(path.stat().st_mode) in result.stderr
    assert_clean_error(run_cli("train", *SHORT, "--book", folder, "--run-dir",
                               tmp_path / "run"), 2, "writable by others")
    assert not (tmp_path / "CANARY").exists()
    path.chmod(stat.S_IMODE(path.stat().st_mode) & ~stat.S_IWOTH)  # the way out it names
    assert run_cli("learn", "check", folder).exit_code == 0
    assert (tmp_path / "CANARY").exists()


def test_group_write_is_harmless_only_in_the_users_own_group(tmp_path, monkeypatch):
    """As Debian's OpenSSH has it: a group that holds the user alone may write (a umask of 002
    with user private groups makes every new file so); any other group may not."""
    from minitfm.learn import trust

    folder = start(tmp_path / "workbook")
    path = folder / "layers.py"
    path.chmod(0o664)
    monkeypatch.setattr(trust, "private_group", lambda gid: True)
    assert run_cli("learn", "check", folder).exit_code == 0
    monkeypatch.setattr(trust, "private_group", lambda gid: False)
    assert_clean_error(run_cli("learn", "check", folder), 2, f"{path} is writable by its group",
                       "-rw-rw-r--", f"chmod go-w {path}")


def test_a_private_group_is_the_users_primary_group_with_no_one_else_in_it(monkeypatch):
    """The group rule itself (not monkeypatched): the user's own primary group, listing no
    other member, and no other user's primary group; a group with no name is no one's."""
    from minitfm.learn import trust

    def system(members, their_gid):
        me = pwd.struct_passwd(("me", "x", 1000, 1000, "", "/home/me", "/bin/sh"))
        ann = pwd.struct_passwd(("ann", "x", 1001, their_gid, "", "/home/ann", "/bin/sh"))
        groups = {1000: grp.struct_group(("me", "x", 1000, members)),
                  1001: grp.struct_group(("ann", "x", 1001, []))}
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        monkeypatch.setattr(pwd, "getpwuid", {1000: me, 1001: ann}.__getitem__)
        monkeypatch.setattr(pwd, "getpwall", lambda: [me, ann])
        monkeypatch.setattr(grp, "getgrgid", groups.__getitem__)

    system([], 1001)
    assert trust.private_group(1000) is True
    assert trust.private_group(1001) is False  # ann's group, not this user's
    assert trust.private_group(4242) is False  # a group with no name
    system(["me"], 1001)  # listing the user itself changes nothing
    assert trust.private_group(1000) is True
    system(["me", "ann"], 1001)  # another member
    assert trust.private_group(1000) is False
    system([], 1000)  # ann's primary group too, though the group lists no member
    assert trust.private_group(1000) is False


# --- a config file never imports a workbook ---

def test_a_config_file_naming_a_workbook_never_imports_it(tmp_path, monkeypatch):
    canary = tmp_path / "CANARY"
    theirs = planted(start(tmp_path / "theirs"), canary)
    config = config_naming(theirs / "config.yaml", ".")  # a run folder that names itself
    result = run_cli("train", config, "--run-dir", tmp_path / "run")
    assert_clean_error(result, 2, "names the workbook", "(model.code)",
                       f"give --book {shown_path(theirs)}")  # as messages print paths
    assert not canary.exists() and not (tmp_path / "run").exists()
    with pytest.raises(MinitfmError, match=re.escape(f"give book='{shown_path(theirs)}'")):
        minitfm.train(config, run_dir=tmp_path / "run", progress=False)
    with pytest.raises(MinitfmError, match="the config given names the workbook"):
        # a mapping, or a Config (a loaded run's, say), is a config as a file is
        minitfm.train({"model": {"code": str(theirs)}}, run_dir=tmp_path / "run")
    assert not canary.exists()
    assert_clean_error(run_cli("sweep", config, "seed=0,1", "--dry-run"), 2,
                       "names the workbook")
    assert not canary.exists()
    # named on the command line, it runs: --book, or the key as an override
    assert run_cli("train", config, "--book", theirs, "--run-dir", tmp_path / "run").exit_code == 0
    assert canary.exists()
    monkeypatch.chdir(tmp_path)
    assert run_cli("train", config, "model.code=theirs", "--print-config").exit_code == 0


# --- the sweep's children: safe paths, and the workbook the sweep was given ---

def test_the_sweeps_commands_keep_the_working_folder_off_the_path_and_name_the_workbook(
        tmp_path, monkeypatch):
    folder = start(tmp_path / "workbook")
    monkeypatch.chdir(tmp_path)
    lines = run_cli("sweep", *TINY, "train.steps=4", "model.code=workbook", "seed=0,1",
                    "--out", tmp_path / "sw", "--dry-run").stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        for command in line.split(" && "):
            argv = shlex.split(command)
            assert argv[:4] == [sys.executable, "-P", "-m", "minitfm"], argv
            if argv[4] == "eval":
                assert argv[argv.index("--book") + 1] == str(folder), argv
    plan = prepare(None, [*TINY, "model.code=workbook", "seed=0,1"],
                   SweepOptions(out=tmp_path / "sw"))
    spec = plan.runs[0]
    (spec.run_dir / "checkpoints").mkdir(parents=True)
    (spec.run_dir / "checkpoints" / "last.pt").touch()  # a run paused midway: resumed
    argv = train_command(plan.grid, spec, 1)
    assert argv[:6] == [sys.executable, "-P", "-m", "minitfm", "train", "--resume"], argv
    assert argv[argv.index("--book") + 1] == str(folder)


@pytest.mark.slow
def test_sweep_children_import_neither_the_working_folder_nor_the_books_code(tmp_path,
                                                                             monkeypatch):
    """A `minitfm/` package and a `tqdm.py` in the working folder are never imported by a
    sweep's children; a workbook the sweep was given is imported by its training and by its
    evaluation alike (each marks its command in a file)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minitfm").mkdir()
    for planted_module in ("minitfm/__init__.py", "tqdm.py"):
        (tmp_path / planted_module).write_text("open('PLANTED-' + __name__, 'a').close()\n")
    folder = start(tmp_path / "workbook")
    path = folder / "attention.py"
    line = "from __future__ import annotations\n"
    path.write_text(path.read_text().replace(
        line, f"{line}import sys\nopen({str(tmp_path)!r} + '/IMPORTED-' + sys.argv[1], 'a')"
              f".close()\n", 1))
    result = run_cli("sweep", *SHORT, "model.code=workbook", "train.eval_every=0",
                     "--seeds", "0", "--jobs", "1", "--eval-samples", "10", "--out",
                     tmp_path / "sw")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert not list(tmp_path.glob("PLANTED-*"))
    assert {p.name for p in tmp_path.glob("IMPORTED-*")} == {"IMPORTED-train", "IMPORTED-eval"}


def test_bench_solves_in_processes_that_keep_the_working_folder_off_the_path(monkeypatch):
    from minitfm.lab.measure import bench

    commands = []
    monkeypatch.setattr(bench, "timed_process", lambda cmd: commands.append(cmd) or (
        1.0, None, '{"steps_to_target": 1, "exact_match": 1.0, "steps": 1}'))
    monkeypatch.setattr(bench, "solve_step", lambda path: {})
    bench.train_subprocess(["train.steps=1"])
    bench.reference_subprocess("torch", ["train.steps=1"])
    assert [cmd[:3] for cmd in commands] == [[sys.executable, "-P", "-m"]] * 2
