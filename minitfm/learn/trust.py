"""Whose code minitfm runs: a learner's workbook only when it is the user's own.

minitfm imports a learner's code only from a folder named on the command line (`--book DIR`, a
`model.code=DIR` override, `learn check DIR`, or the workbook `learn check` finds where it is
run), and only when that folder and every file imported from it belong to the user running
minitfm and nobody else may write them, by their mode or by an ACL entry: else another user
could make minitfm run code as you (git's `safe.directory` refuses another user's repository
so). A group that holds the user alone may write (user private groups, whose umask of 002 makes
every new file so; Debian's OpenSSH judges such files harmless likewise). The folders above the
workbook, up to `/`, must be root's or the user's, and no one else may rename what they hold
(OpenSSH's StrictModes asks as much of `~/.ssh`'s): else someone could put a folder of theirs
in place of the workbook. A sticky folder, as `/tmp`, lets only an entry's owner rename it.

Each check reads a descriptor (`pinned` opens the files and folders, and checks each as it
opens it), never a path: what is checked is what is read.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
import struct
from pathlib import Path

from minitfm.errors import MinitfmError

# The access ACL as Linux keeps it (linux/posix_acl_xattr.h): a little-endian header of version
# 2, then one entry per user or group: (tag u16, permissions u16, id u32).
ACL_XATTR = "system.posix_acl_access"
ACL_VERSION = 2
ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK = 0x02, 0x04, 0x08, 0x10
ACL_WRITE = 0x02
NO_ACL = (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP)  # none set, or no xattrs there


def check_trusted(path: Path, fd: int, folder: Path) -> None:
    """The file or folder `path`, open as `fd`, belongs to this user and no one else may write
    it; else one line naming it and the way out (`folder`: the workbook, to copy)."""
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise MinitfmError(f"{path} belongs to {user_name(info.st_uid)} (uid {info.st_uid}), "
                           f"not to you: minitfm runs only a workbook of your own, since its "
                           f"code runs as you; read it, then copy it into a folder of yours "
                           f"(cp -r {folder} mine) and give that one")
    acl = read_acl(fd)
    whom = writers(info, acl)
    if whom:
        raise MinitfmError(f"{path} is writable by {whom} ({mode_text(info, acl)}): whoever may "
                           f"write it could make minitfm run code as you; make it yours alone "
                           f"({way_out(path, info, acl)}), then try again")


def check_above(path: Path, fd: int, folder: Path) -> None:
    """The folder `path` above the workbook `folder`, open as `fd`: root's or this user's, and
    no one else may rename what it holds (sticky excepted); else one line naming it."""
    info = os.fstat(fd)
    if info.st_uid not in (0, os.geteuid()):
        raise MinitfmError(f"{path} belongs to {user_name(info.st_uid)} (uid {info.st_uid}): "
                           f"its owner could put a folder of theirs in place of the workbook "
                           f"{folder} and minitfm would run it as you; keep your workbook in a "
                           f"folder of your own (cp -r {folder} ~/workbook), then give that one")
    if info.st_mode & stat.S_ISVTX:  # in a sticky folder, only an entry's owner may rename it
        return
    acl = read_acl(fd)
    whom = writers(info, acl)
    if whom:
        raise MinitfmError(f"{path} is writable by {whom} ({mode_text(info, acl)}): whoever may "
                           f"write it could put a folder of theirs in place of the workbook "
                           f"{folder}; make it yours alone ({way_out(path, info, acl)}) or keep "
                           f"your workbook in a folder of your own, then try again")


def read_acl(fd: int) -> bytes:
    """The access ACL of the file open as `fd`, as Linux stores it; b"" when it has none, or
    the system or filesystem keeps none. A folder open only to pass through (O_PATH) is read
    through its /proc entry, which names the same folder."""
    if not hasattr(os, "getxattr"):
        return b""
    try:
        try:
            return os.getxattr(fd, ACL_XATTR)
        except OSError as err:
            if err.errno != errno.EBADF:
                raise
            return os.getxattr(f"/proc/self/fd/{fd}", ACL_XATTR)
    except OSError as err:
        if err.errno in NO_ACL:
            return b""
        raise


def acl_entries(acl: bytes) -> list[tuple[int, int, int]] | None:
    """The (tag, permissions, id) entries of `acl`; None when it is not a version-2 ACL."""
    count, rest = divmod(len(acl) - 4, 8)
    if count < 0 or rest or struct.unpack_from("<I", acl)[0] != ACL_VERSION:
        return None
    return [struct.unpack_from("<HHI", acl, 4 + 8 * n) for n in range(count)]


def writers(info: os.stat_result, acl: bytes = b"") -> str:
    """Who besides the owner may write the file `info` describes, its ACL `acl` counted
    ("" when no one may)."""
    group = group_writes(info, acl) and not private_group(info.st_gid)
    others = bool(info.st_mode & stat.S_IWOTH)
    mode = [whom for whom, may in (("its group", group), ("others", others)) if may]
    return " and ".join([*mode, *acl_writers(acl, info)])


def group_writes(info: os.stat_result, acl: bytes) -> bool:
    """Whether the file's own group may write: its group bits, or with an ACL (whose mask the
    group bits show) its group entry within the mask."""
    entries = acl_entries(acl) if acl else None
    if not entries:
        return bool(info.st_mode & stat.S_IWGRP)
    mask = next((perm for tag, perm, _ in entries if tag == ACL_MASK), 0o7)
    return any(tag == ACL_GROUP_OBJ and perm & mask & ACL_WRITE for tag, perm, _ in entries)


def acl_writers(acl: bytes, info: os.stat_result) -> list[str]:
    """The users and groups an ACL entry lets write, within its mask, besides the owner and a
    group that holds this user alone: as "NAME (uid N) through its ACL"."""
    if not acl:
        return []
    entries = acl_entries(acl)
    if entries is None:
        return ["whoever its ACL names (an ACL minitfm cannot read)"]
    mask = next((perm for tag, perm, _ in entries if tag == ACL_MASK), 0o7)
    whom = []
    for tag, perm, ident in entries:
        if not perm & mask & ACL_WRITE:
            continue
        if tag == ACL_USER and ident != info.st_uid:
            whom.append(f"{user_name(ident)} (uid {ident}) through its ACL")
        elif tag == ACL_GROUP and not private_group(ident):
            whom.append(f"the group {group_name(ident)} (gid {ident}) through its ACL")
    return whom


def mode_text(info: os.stat_result, acl: bytes) -> str:
    """The mode as `ls -l` shows it: a `+` when the file has an ACL."""
    return stat.filemode(info.st_mode) + ("+" if acl else "")


def way_out(path: Path, info: os.stat_result, acl: bytes) -> str:
    """The commands that leave `path` writable by its owner alone."""
    commands = []
    if info.st_mode & stat.S_IWOTH or (group_writes(info, acl)
                                       and not private_group(info.st_gid)):
        commands.append(f"chmod go-w {path}")
    if acl_writers(acl, info):
        commands.append(f"setfacl -b {path}")
    return " and ".join(commands)


def private_group(gid: int) -> bool:
    """Whether the group `gid` holds this user alone: the user's primary group, with no other
    member, and no other user's primary group."""
    try:
        me = pwd.getpwuid(os.geteuid())
        members = grp.getgrgid(gid).gr_mem
    except KeyError:  # a user or group with no name: nothing to judge by
        return False
    if gid != me.pw_gid or any(name != me.pw_name for name in members):
        return False
    return not any(user.pw_gid == gid and user.pw_uid != me.pw_uid for user in pwd.getpwall())


def user_name(uid: int) -> str:
    """The name of the user `uid`, or "another user" when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "another user"


def group_name(gid: int) -> str:
    """The name of the group `gid`, or "with no name" when it has none."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return "with no name"
