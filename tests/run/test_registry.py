"""The thread registry is used only when this user alone can write it (the adversarial report
of 2026-11-24, H1 and M1).

Planted links, FIFOs and folders of others are never followed, never opened for reading and
never written through: the command goes on (unregistered, or skipping the entry) with one
`warning:` line, and a folder it does not trust is left as planted (no entry of its own, nothing
removed). Each case plants its files in a private HOME and TMPDIR, then registers as every
computing command does; where a mistake would hang (a FIFO), in a child process whose timeout
is a safety net, not the assertion.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from minitfm.run import threads
from minitfm.run.threads import ThreadClaim, registry_dir
from tests.helpers import TINY, run_cli

OTHER_UID = 23457  # the report's other local user
IS_ROOT = os.geteuid() == 0
# What `eval`, `predict`, `train`... do first: register, then read the neighbours (twice, as
# training does every second: the warning still comes once).
# Inside the claim it also prints its pid and the listings of the folders named in WATCHED.
# Other programs' load is left out (CpuLoad.others: 0): the registry alone decides here, so the
# two counts agree however busy the machine is (run/cpuload.py has tests of its own).
CLAIM = ("import json, os, sys\n"
         "from minitfm.run.threads import CpuLoad, ThreadClaim\n"
         "CpuLoad.others = lambda self, pids: 0\n"
         "say = lambda text: print('warning:', text, file=sys.stderr)\n"
         "with ThreadClaim('auto', warn=say) as claim:\n"
         "    print(claim.resolve(), claim.resolve())\n"
         "    watched = json.loads(os.environ['WATCHED'])\n"
         "    print(json.dumps([os.getpid(), {f: sorted(os.listdir(f)) for f in watched}]))\n")


def next_pids(count: int) -> range:
    """The pids the next processes are likely to get, as the report's attacker guessed them."""
    try:
        last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    except (OSError, ValueError):
        last = os.getpid()
    return range(last + 1, last + 1 + count)


def give_away(path: Path) -> None:
    """Make `path` another user's, where this test may (as root)."""
    if IS_ROOT:
        os.chown(path, OTHER_UID, OTHER_UID)


def planted_folder(s: Scene) -> Path:
    """The report's attack: the temp-folder registry made first, by someone else, for all."""
    folder = s.tmp / f"minitfm-{os.geteuid()}"
    s.untrusted = [folder, folder / "procs"]
    (folder / "procs").mkdir(parents=True)
    for path in (folder / "procs", folder):
        path.chmod(0o777)
        give_away(path)
    return folder


def plant_hidden_links(s: Scene) -> str:
    """REG_symlink: `.<pid>.tmp` links to the victim for this process's pid (the case registers
    in it) and the next pids, where minitfm wrote."""
    folder = planted_folder(s)
    for pid in {os.getpid(), *next_pids(300)}:
        for where in (folder, folder / "procs"):
            (where / f".{pid}.tmp").symlink_to(s.victim)
    return "owned by uid 23457" if IS_ROOT else "is writable by others (mode 777)"


def plant_fifo_in_tmp(s: Scene) -> str:
    """REG_fifo: a FIFO among the entries of the temp-folder registry."""
    folder = planted_folder(s)
    os.mkfifo(folder / "1")
    os.mkfifo(folder / "procs" / "1")
    return "owned by uid 23457" if IS_ROOT else "is writable by others (mode 777)"


def plant_fifo_entries(s: Scene) -> str:
    """A FIFO (two, to see one warning) in this user's own registry."""
    s.registry.mkdir(mode=0o700, parents=True)
    os.mkfifo(s.registry / "1")
    os.mkfifo(s.registry / "2")
    return "is a FIFO, not a file minitfm wrote: skipped"


def plant_fifo_env(s: Scene) -> str:
    """REG_fifo_env: MINITFM_REGISTRY names a folder of the user's with a FIFO in it."""
    s.env["MINITFM_REGISTRY"] = str(s.registry)
    return plant_fifo_entries(s)


def plant_link_entry(s: Scene) -> str:
    """An entry that is a link to the victim: never opened through."""
    s.registry.mkdir(mode=0o700, parents=True)
    (s.registry / "123").symlink_to(s.victim)
    return "is a symbolic link, not a file minitfm wrote"


def plant_folder_entry(s: Scene) -> str:
    """An entry that is a folder."""
    s.registry.mkdir(mode=0o700, parents=True)
    (s.registry / "7").mkdir()
    return "is a folder, not a file minitfm wrote"


def plant_linked_registry(s: Scene) -> str:
    """The registry folder itself a link (to a folder of the victim's)."""
    s.registry.parent.mkdir(parents=True)
    s.registry.symlink_to(s.victim.parent)
    s.untrusted = [s.registry]
    return "is a symbolic link: not used (threads=auto cannot see other minitfm processes); " \
        "remove the link"


def plant_writable(mode: int):
    """A plant for the user's registry folder with `mode`."""

    def plant(s: Scene) -> str:
        s.registry.mkdir(mode=0o700, parents=True)
        s.registry.chmod(mode)
        s.untrusted = [s.registry]
        return f"is writable by others (mode {mode:o}): not used"
    plant.__doc__ = f"The user's registry folder with mode {mode:o}."
    return plant


def plant_foreign(s: Scene) -> str:
    """The user's registry folder owned by another uid."""
    if not IS_ROOT:
        pytest.skip("only root can give a folder to another uid")
    s.registry.mkdir(mode=0o700, parents=True)
    give_away(s.registry)
    s.untrusted = [s.registry]
    return f"is owned by uid {OTHER_UID}, not by you (uid 0)"


class Scene:
    """A private HOME and TMPDIR, a victim file, the environment of the process, and the planted
    folders it must not use (`untrusted`, set by the plant)."""

    def __init__(self, root: Path, home_is_a_file: bool):
        self.victim = root / "victim" / "precious.txt"
        self.victim.parent.mkdir()
        self.victim.write_text("victim's precious notes\n")
        self.victim.chmod(0o600)
        self.tmp = root / "tmp"
        self.tmp.mkdir()
        self.tmp.chmod(0o1777)  # as /tmp is
        home = root / "home"
        if home_is_a_file:  # no usable home: the registry falls back to the temp folder
            home.write_text("")
        else:
            home.mkdir()
        self.registry = home / ".cache" / "minitfm" / "procs"
        self.untrusted: list[Path] = []
        drop = ("OMP_NUM_THREADS", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "MINITFM_REGISTRY")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(HOME=str(home), TMPDIR=str(self.tmp))


def listings(folders: list[Path]) -> dict[str, list[str]]:
    """The entries of each folder, sorted (through a planted link: the folder it names)."""
    return {str(folder): sorted(os.listdir(folder)) for folder in folders}


def register_in_child(scene: Scene) -> tuple[list[int], list[str], int, dict]:
    """Register in another process (for what would hang if it went wrong): counts, warnings,
    its pid and the untrusted folders' listings while it was registered."""
    env = {**scene.env, "WATCHED": json.dumps([str(f) for f in scene.untrusted])}
    proc = subprocess.run([sys.executable, "-c", CLAIM], env=env, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    counts, inside = proc.stdout.splitlines()
    pid, seen = json.loads(inside)
    return [int(n) for n in counts.split()], proc.stderr.splitlines(), pid, seen


def register_here(scene: Scene, monkeypatch) -> tuple[list[int], list[str], int, dict]:
    """Register in this process, in the scene's environment: counts, warnings, its pid and the
    untrusted folders' listings while it was registered."""
    for name in {*os.environ} - {*scene.env}:
        monkeypatch.delenv(name)
    for name, value in scene.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(threads.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.setattr(threads.CpuLoad, "others", lambda self, pids: 0)  # as in CLAIM
    warnings = []
    with ThreadClaim("auto", warn=lambda text: warnings.append(f"warning: {text}")) as claim:
        counts = [claim.resolve(), claim.resolve()]
        seen = listings(scene.untrusted)
    return counts, warnings, os.getpid(), seen


# case: (plant, no usable home, would hang if opened)
CASES = {
    "REG_symlink": (plant_hidden_links, True, False),
    "REG_fifo": (plant_fifo_in_tmp, True, True),
    "REG_fifo_env": (plant_fifo_env, False, True),
    "fifo_entries": (plant_fifo_entries, False, True),
    "link_entry": (plant_link_entry, False, False),
    "folder_entry": (plant_folder_entry, False, False),
    "linked_registry": (plant_linked_registry, False, False),
    "world_writable": (plant_writable(0o777), False, False),
    "group_writable": (plant_writable(0o770), False, False),
    "other_owner": (plant_foreign, False, False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_planted_registry_is_not_trusted(tmp_path, monkeypatch, case):
    plant, home_is_a_file, would_hang = CASES[case]
    scene = Scene(tmp_path, home_is_a_file)
    needle = plant(scene)
    planted = listings(scene.untrusted)
    if would_hang:
        counts, warnings, pid, seen = register_in_child(scene)
    else:
        counts, warnings, pid, seen = register_here(scene, monkeypatch)
    # an untrusted folder is not used: no entry of this process's, nothing removed or added
    assert seen == planted and not any(str(pid) in names for names in seen.values()), seen
    assert listings(scene.untrusted) == planted
    assert counts[0] == counts[1] >= 1
    assert len(warnings) == 1 and warnings[0].startswith("warning: thread registry "), warnings
    assert needle in warnings[0], (needle, warnings[0])
    assert scene.victim.read_text() == "victim's precious notes\n"
    assert stat.S_IMODE(scene.victim.stat().st_mode) == 0o600
    assert os.listdir(scene.victim.parent) == ["precious.txt"]


def test_a_fresh_registry_is_made_for_this_user_alone(tmp_path, monkeypatch):
    for name in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "MINITFM_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert registry_dir() == tmp_path / "home" / ".cache" / "minitfm" / "procs"
    with ThreadClaim(1, warn=pytest.fail) as claim:
        assert claim.path.read_text() == "1"
        for folder in (claim.registry, claim.registry.parent):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not claim.path.exists()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "home"))
    assert registry_dir() == tmp_path / "home" / "minitfm" / "procs"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    monkeypatch.setenv("HOME", str(tmp_path / "nowhere"))  # no home: a folder of its own in tmp
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(threads.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert registry_dir() == tmp_path / f"minitfm-{os.geteuid()}"


def test_a_hidden_name_found_in_place_is_replaced_not_followed(tmp_path):
    registry = tmp_path / "procs"
    registry.mkdir(mode=0o700)
    victim = tmp_path / "precious.txt"
    victim.write_text("notes")
    (registry / f".{os.getpid()}.tmp").symlink_to(victim)  # left by a killed process, say
    with ThreadClaim(2, registry, warn=pytest.fail) as claim:
        assert claim.path.read_text() == "2" and not claim.path.is_symlink()
    assert victim.read_text() == "notes"
    assert not list(registry.iterdir())


def test_the_cli_says_it_in_one_warning_line(tmp_path, monkeypatch):
    registry = tmp_path / "procs"
    registry.mkdir(mode=0o777)
    registry.chmod(0o777)
    monkeypatch.setenv("MINITFM_REGISTRY", str(registry))
    result = run_cli("train", *TINY, "train.steps=2", "train.warmup_steps=0",
                     "train.eval_every=0", "log.tensorboard=false", "--run-dir", tmp_path / "r")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.startswith("warning: thread registry ") and \
        result.stderr.count("\n") == 1, result.stderr
    assert "chmod 700" in result.stderr and not list(registry.iterdir())
