"""Whose code minitfm runs: a learner's workbook only when it is the user's own.

minitfm imports a learner's code only from a folder named on the command line (`--book DIR`, a
`model.code=DIR` override, `learn check DIR`, or the workbook `learn check` finds where it is
run), and only when that folder and the files imported from it belong to the user running
minitfm and nobody else may write them: else another user could make minitfm run code as you
(git's `safe.directory` refuses another user's repository so). A group that holds the user alone
may write (user private groups, whose umask of 002 makes every new file so; Debian's OpenSSH
judges such files harmless likewise).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from minitfm.errors import MinitfmError


def check_trusted(folder: Path, files: Iterable[Path]) -> None:
    """`folder` and `files` (those that exist) belong to this user and no one else may write
    them; else one line naming the first that fails, and the way out."""
    for path in [folder, *files]:
        try:
            info = path.stat()
        except OSError:  # a missing chapter: the import says so
            continue
        if info.st_uid != os.geteuid():
            raise MinitfmError(f"{path} belongs to {user_name(info.st_uid)} (uid {info.st_uid}), "
                               f"not to you: minitfm runs only a workbook of your own, since its "
                               f"code runs as you; read it, then copy it into a folder of yours "
                               f"(cp -r {folder} mine) and give that one")
        whom = writers(info)
        if whom:
            raise MinitfmError(f"{path} is writable by {whom} ({stat.filemode(info.st_mode)}): "
                               f"whoever may write it could make minitfm run code as you; make "
                               f"it yours alone (chmod go-w {path}), then try again")


def writers(info: os.stat_result) -> str:
    """Who besides the owner may write the file `info` describes ("" when no one may)."""
    group = bool(info.st_mode & stat.S_IWGRP) and not private_group(info.st_gid)
    others = bool(info.st_mode & stat.S_IWOTH)
    return " and ".join(whom for whom, may in (("its group", group), ("others", others)) if may)


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
