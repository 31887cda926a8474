"""What of a workbook minitfm reads, and how (the adversarial report of 2026-12-07, H1, M1, H3):
an ACL entry that lets another user or group write counts as the mode does; every file the
workbook imports is checked as it is read, a helper module or a package folder as a chapter;
no file is read through a link; the folders above the workbook must be root's or the user's and
writable by no one else (sticky excepted); and what runs is what was checked, whatever is
renamed meanwhile."""

import errno
import hashlib
import importlib
import os
import re
import shutil
import stat
import struct
import subprocess

import pytest

from minitfm.errors import MinitfmError
from minitfm.learn.exercises import CHAPTERS
from minitfm.learn.workbook import load_workbook
from tests.helpers import assert_clean_error, run_cli
from tests.learn.test_trust import planted
from tests.learn.test_workbook import SHORT, start

IS_ROOT = os.geteuid() == 0

# --- ACLs: an entry that lets another user or group write counts as the mode does ---

OTHER = 65534  # another user (nobody here) and another group
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 1, 2, 4, 8, 0x10, 0x20
ANY = 0xFFFFFFFF  # the id of an entry that has none (owner, group, mask, others)


def acl_bytes(*entries):
    """An access ACL as Linux keeps it in `system.posix_acl_access`: a version-2 header, then
    (tag u16, permissions u16, id u32) entries, little-endian."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def grant(path, tag, ident, perms=0o6):
    """As `setfacl -m u:IDENT:rw PATH` (`g:` for ACL_GROUP): an entry giving `perms` to
    `ident`, and the mask setfacl computes; the xattr written by hand where setfacl is
    missing (skipped where the filesystem keeps no ACLs)."""
    if shutil.which("setfacl"):
        perm_text = "".join(c if perms & bit else "-" for c, bit in zip("rwx", (4, 2, 1)))
        kind = "u" if tag == ACL_USER else "g"
        subprocess.run(["setfacl", "-m", f"{kind}:{ident}:{perm_text}", str(path)], check=True)
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    group = mode >> 3 & 7
    entries = sorted([(ACL_USER_OBJ, mode >> 6 & 7, ANY), (tag, perms, ident),
                      (ACL_GROUP_OBJ, group, ANY), (ACL_MASK, group | perms, ANY),
                      (ACL_OTHER, mode & 7, ANY)])
    try:
        os.setxattr(path, "system.posix_acl_access", acl_bytes(*entries))
    except OSError as err:
        if err.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            pytest.skip(f"{path.parent} is on a filesystem that keeps no ACLs")
        raise


def drop_acl(path, mode):
    """As `setfacl -b PATH` (the way out the error names), and the mode `mode` back."""
    if shutil.which("setfacl"):
        subprocess.run(["setfacl", "-b", str(path)], check=True)
    else:
        os.removexattr(path, "system.posix_acl_access")
    path.chmod(mode)


@pytest.mark.parametrize("writable, tag", [("", ACL_USER), ("attention.py", ACL_USER),
                                           ("__init__.py", ACL_GROUP), ("layers.py", ACL_GROUP)])
def test_a_workbook_another_user_may_write_through_an_acl_is_never_imported(tmp_path, writable,
                                                                            tag):
    folder = planted(start(tmp_path / "workbook"), tmp_path / "CANARY")
    path = folder / writable
    mode = stat.S_IMODE(path.stat().st_mode)
    grant(path, tag, OTHER, 0o7 if path.is_dir() else 0o6)
    result = run_cli("learn", "check", folder)
    assert_clean_error(result, 2, f"error: {path} is writable by ",
                       f"(gid {OTHER}) through its ACL" if tag == ACL_GROUP else
                       f"(uid {OTHER}) through its ACL", "+): ", f"(setfacl -b {path})")
    assert_clean_error(run_cli("train", *SHORT, "--book", folder, "--run-dir",
                               tmp_path / "run"), 2, "through its ACL")
    assert not (tmp_path / "CANARY").exists()
    drop_acl(path, mode)  # the way out it names
    assert run_cli("learn", "check", folder).exit_code == 0
    assert (tmp_path / "CANARY").exists()


def test_an_acl_counts_only_the_writes_its_mask_lets_through(monkeypatch):
    from minitfm.learn import trust

    monkeypatch.setattr(trust, "private_group", lambda gid: gid == 4242)
    me = os.geteuid()

    def who(mode, gid, *named, mask=None):
        owner, group, others = mode >> 6 & 7, mode >> 3 & 7, mode & 7
        entries = [(ACL_USER_OBJ, owner, ANY), *[(t, p, i) for t, p, i in named if t == ACL_USER],
                   (ACL_GROUP_OBJ, group, ANY), *[(t, p, i) for t, p, i in named if t == ACL_GROUP],
                   *([] if mask is None else [(ACL_MASK, mask, ANY)]), (ACL_OTHER, others, ANY)]
        mode_bits = mode if mask is None else mode & ~0o70 | mask << 3  # ls shows the mask
        info = os.stat_result((stat.S_IFREG | mode_bits, 0, 0, 1, me, gid, 0, 0, 0, 0))
        return trust.writers(info, acl_bytes(*entries))

    assert who(0o644, 5) == ""  # the base entries alone, no write for others
    assert who(0o644, 5, (ACL_USER, 4, OTHER), mask=4) == ""  # a reader
    assert who(0o644, 5, (ACL_USER, 6, OTHER), mask=4) == ""  # a writer the mask stops
    assert who(0o644, 5, (ACL_USER, 6, me), mask=6) == ""  # the owner named again
    assert who(0o644, 5, (ACL_GROUP, 6, 4242), mask=6) == ""  # a group of the user's alone
    assert who(0o664, 5, mask=4) == ""  # the file's group, its write masked
    assert f"(uid {OTHER}) through its ACL" in who(0o644, 5, (ACL_USER, 6, OTHER), mask=6)
    assert f"(gid {OTHER}) through its ACL" in who(0o644, 5, (ACL_GROUP, 7, OTHER), mask=7)
    assert who(0o664, 5, (ACL_USER, 4, OTHER), mask=6) == "its group"  # its entry: rw
    assert who(0o644, 5, (ACL_USER, 4, OTHER), mask=6) == ""  # group bits rw: the mask only
    unreadable = b"\x01\x00\x00\x00"  # version 1
    assert trust.writers(os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, me, 5, 0, 0, 0, 0)),
                         unreadable) == "whoever its ACL names (an ACL minitfm cannot read)"


def test_a_file_with_no_acl_or_on_a_filesystem_with_no_xattrs_has_none(tmp_path, monkeypatch):
    from minitfm.learn import trust

    path = tmp_path / "file"
    path.write_text("x")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert trust.read_acl(fd) == b""  # none set (ENODATA)
        for code in (errno.ENOTSUP, errno.ENODATA):
            def no_xattrs(*args, code=code):
                raise OSError(code, os.strerror(code))
            monkeypatch.setattr(os, "getxattr", no_xattrs)
            assert trust.read_acl(fd) == b""
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="O_PATH is Linux's")
def test_an_acl_is_read_through_a_folder_opened_only_to_pass_through(tmp_path):
    """A folder above the workbook that the user may pass through but not list (711) is opened
    with O_PATH, whose descriptor fgetxattr refuses: its ACL is read through /proc."""
    from minitfm.learn import trust

    folder = tmp_path / "shared"
    folder.mkdir(mode=0o711)
    grant(folder, ACL_USER, OTHER, 0o7)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        assert trust.read_acl(fd) == os.getxattr(folder, trust.ACL_XATTR) != b""
        assert f"(uid {OTHER}) through its ACL" in trust.writers(os.fstat(fd), trust.read_acl(fd))
    finally:
        os.close(fd)


# --- every file the workbook imports, through the folder checked ---

def with_imports(folder, ran):
    """`folder`'s layers.py importing a helper.py and a package pkg/ (its mod.py): each one
    creates a file in `ran` when it runs."""
    (folder / "pkg").mkdir(mode=0o755)
    for name in ("helper.py", "pkg/__init__.py", "pkg/mod.py"):
        (folder / name).write_text(f"open({str(ran / name.replace('/', '-'))!r}, 'a').close()\n")
    layers = folder / "layers.py"
    line = "from __future__ import annotations\n"
    layers.write_text(layers.read_text().replace(
        line, f"{line}from . import helper\nfrom .pkg import mod\n", 1))
    return folder


@pytest.mark.parametrize("untrusted", ["helper.py", "pkg", "pkg/__init__.py", "pkg/mod.py"])
def test_every_file_the_workbook_imports_is_checked_before_it_runs(tmp_path, untrusted):
    ran = tmp_path / "ran"
    ran.mkdir()
    trusted = with_imports(start(tmp_path / "trusted"), ran)
    assert run_cli("learn", "check", trusted, "attention").exit_code == 0
    assert sorted(p.name for p in ran.iterdir()) == ["helper.py", "pkg-__init__.py", "pkg-mod.py"]
    for path in ran.iterdir():
        path.unlink()
    folder = with_imports(start(tmp_path / "workbook"), ran)
    path = folder / untrusted
    path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWOTH)
    assert_clean_error(run_cli("learn", "check", folder, "attention"), 2,
                       f"{path} is writable by others", f"chmod go-w {path}")
    ran_after = {p.name for p in ran.iterdir()}
    assert not ran_after & {untrusted.replace("/", "-"), "pkg-mod.py"}, ran_after


def test_a_helper_module_of_another_user_is_never_run(tmp_path):
    if not IS_ROOT:
        pytest.skip("only root may give a file to another user")
    ran = tmp_path / "ran"
    ran.mkdir()
    folder = with_imports(start(tmp_path / "workbook"), ran)
    os.chown(folder / "helper.py", OTHER, OTHER)
    assert_clean_error(run_cli("learn", "check", folder, "attention"), 2,
                       f"{folder / 'helper.py'} belongs to ", f"(uid {OTHER}), not to you")
    assert not list(ran.iterdir())


def test_a_module_imported_after_the_workbook_loaded_is_checked_as_it_is_read(tmp_path):
    """An import inside a function runs when the function does: the file is read then, through
    the folder reached and checked anew."""
    folder = start(tmp_path / "workbook")
    package = load_workbook(folder).modules["layers"].__package__
    (folder / "late.py").write_text("VALUE = 7\n")
    assert importlib.import_module(f"{package}.late").VALUE == 7
    (folder / "later.py").write_text(f"open({str(tmp_path / 'CANARY')!r}, 'a').close()\n")
    (folder / "later.py").chmod(0o646)
    with pytest.raises(MinitfmError, match=re.escape(f"{folder / 'later.py'} is writable by "
                                                     f"others")):
        importlib.import_module(f"{package}.later")
    assert not (tmp_path / "CANARY").exists()


@pytest.mark.parametrize("name", ["attention.py", "__init__.py", "helper.py"])
def test_a_file_of_the_workbook_that_is_a_link_is_never_read(tmp_path, name):
    """Even a link to a file of the user's own: whoever may change what it names (or the folders
    on the way there) could make minitfm run their code."""
    ran = tmp_path / "ran"
    ran.mkdir()
    folder = with_imports(start(tmp_path / "workbook"), ran)
    target = tmp_path / f"elsewhere-{name}"
    target.write_bytes((folder / name).read_bytes())
    (folder / name).unlink()
    (folder / name).symlink_to(target)
    assert_clean_error(run_cli("learn", "check", folder, "attention"), 2,
                       f"{folder / name} is a link (to {target})", "put a copy")
    if IS_ROOT:  # a link to another user's file (the report's G1), likewise
        os.lchown(folder / name, OTHER, OTHER)
        os.chown(target, OTHER, OTHER)
        assert_clean_error(run_cli("learn", "check", folder, "attention"), 2, "is a link")
    assert not list(ran.iterdir())


# --- the folders above the workbook, and the folder renamed meanwhile ---

@pytest.mark.parametrize("who", ["others", "group", "acl", "owner"])
def test_a_folder_above_the_workbook_that_others_may_write_is_refused(tmp_path, monkeypatch,
                                                                      who):
    """As OpenSSH's StrictModes for `~/.ssh`: whoever may rename what a folder above the
    workbook holds could put a workbook of theirs in its place, between the check and the
    import. A sticky folder, as /tmp, lets only an entry's owner rename it."""
    from minitfm.learn import trust

    above = tmp_path / "course"
    folder = planted(start(above / "term" / "workbook"), tmp_path / "CANARY")
    if who == "others":
        above.chmod(0o777)
        needles = [f"{above} is writable by others (drwxrwxrwx)", f"chmod go-w {above}"]
    elif who == "group":  # a group holding another user too
        above.chmod(0o775)
        monkeypatch.setattr(trust, "private_group", lambda gid: False)
        needles = [f"{above} is writable by its group (drwxrwxr-x)", f"chmod go-w {above}"]
    elif who == "acl":
        grant(above, ACL_USER, OTHER, 0o7)
        needles = [f"{above} is writable by ", f"(uid {OTHER}) through its ACL",
                   f"setfacl -b {above}"]
    else:
        if not IS_ROOT:
            pytest.skip("only root may give a folder to another user")
        os.chown(above, OTHER, OTHER)
        needles = [f"{above} belongs to ", f"(uid {OTHER})", f"cp -r {folder} ~/workbook"]
    result = run_cli("learn", "check", folder)
    assert_clean_error(result, 2, *needles, f"in place of the workbook {folder}")
    assert_clean_error(run_cli("train", *SHORT, "--book", folder, "--run-dir",
                               tmp_path / "run"), 2, needles[0])
    assert not (tmp_path / "CANARY").exists()
    if who in ("others", "group"):
        above.chmod(0o1777)  # sticky: no one may rename the workbook but its owner
        assert run_cli("learn", "check", folder).exit_code == 0
        assert (tmp_path / "CANARY").exists()


def test_the_workbook_checked_is_the_one_imported_whatever_is_renamed_meanwhile(tmp_path,
                                                                                monkeypatch):
    """The report's swap (H3), made certain: once the folder is checked, the workbook at its
    path is swapped for another (another user's, as root can make it). What runs is what was
    checked: every file is read through the folder opened for the check."""
    from minitfm.learn import workbook

    mine = with_imports(planted(start(tmp_path / "workbook"), tmp_path / "MINE"), tmp_path)
    theirs = with_imports(planted(start(tmp_path / "theirs"), tmp_path / "THEIRS"),
                          tmp_path / "theirs-ran")
    (tmp_path / "theirs-ran").mkdir()
    if IS_ROOT:
        for path in [theirs, *theirs.rglob("*")]:
            os.lchown(path, OTHER, OTHER)
    check_kind = workbook.check_kind

    def swapped_then_check_kind(*args):
        mine.rename(tmp_path / "mine-now")
        theirs.rename(mine)
        return check_kind(*args)

    monkeypatch.setattr(workbook, "check_kind", swapped_then_check_kind)
    loaded = workbook.load_workbook(mine)
    assert (tmp_path / "MINE").exists() and not (tmp_path / "THEIRS").exists()
    assert {p.name for p in tmp_path.glob("*.py")} == {"helper.py", "pkg-__init__.py",
                                                       "pkg-mod.py"}
    assert not list((tmp_path / "theirs-ran").iterdir())
    assert loaded.digest == hashlib.sha256(b"".join(
        (tmp_path / "mine-now" / f"{chapter}.py").read_bytes() for chapter in CHAPTERS)).hexdigest()
