"""How a workbook's files are read and imported: through its folder, opened once and checked.

`open_folder` reaches the workbook's folder from `/` one folder at a time, never through a link,
and checks each folder above it (`trust.check_above`) before it looks the next one up in it,
then the workbook's own folder (`trust.check_trusted`). A `Pin` holds that folder open while the
workbook loads. Every file imported from it (the chapters, and whatever they import: a
`helper.py`, a package folder) is opened through that descriptor by its one name, never through
a link, checked on its own descriptor, and read once; `Checked` compiles those very bytes. So
what runs is what was checked, whatever is renamed meanwhile: no path is looked up again.

`WorkbookFinder` finds the modules of a workbook's packages (those whose spec holds a `Pin`)
and nothing else; such a package's `__path__` is empty, so none of Python's own finders looks in
its folder. A module imported once the workbook has loaded (an import inside a function) is read
the same way, through the folder reached and checked anew.
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.machinery
import importlib.util
import os
import stat
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from minitfm.errors import MinitfmError
from minitfm.learn.trust import check_above, check_trusted

PACKAGE = "minitfm_workbook_"  # how the name of every workbook package begins
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PASS_THROUGH = getattr(os, "O_PATH", None)  # Linux: a folder one may pass through, not list
FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO's open: no wait


def open_entry(dir_fd: int, name: str, path: Path, folder: bool = False) -> int:
    """`name` in the folder open as `dir_fd` (`path`, for messages) opened itself, never
    through a link (a link: one line saying so); OSError when it cannot be opened."""
    try:
        return os.open(name, FOLDER if folder else FILE, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise MinitfmError(link_text(dir_fd, name, path)) from None
        if not (folder and err.errno == errno.EACCES and PASS_THROUGH is not None):
            raise
    return os.open(name, PASS_THROUGH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=dir_fd)


def link_text(dir_fd: int, name: str, path: Path) -> str:
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        target = "elsewhere"
    return (f"{path} is a link (to {target}): minitfm reads a workbook from its own folder, "
            f"never through a link, since whoever may change what a link names could make "
            f"minitfm run code as you; put a copy of what it names in its place, then try again")


def open_folder(folder: Path) -> int:
    """The workbook's folder `folder` (absolute, with no link in it) open, reached from `/`
    one folder at a time: each checked before the next is looked up in it, the last as a
    workbook's own folder. One line when a folder on the way will not open."""
    at, fd = Path(folder.anchor), os.open(folder.anchor, FOLDER)
    try:
        for part in folder.parts[1:]:
            check_above(at, fd, folder)
            try:
                inner = open_entry(fd, part, at / part, folder=True)
            except OSError as err:  # gone since, or no way through
                raise MinitfmError(f"cannot open {at / part}: {err.strerror or err}") from None
            os.close(fd)
            fd, at = inner, at / part
        check_trusted(folder, fd, folder)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_checked(dir_fd: int, name: str, path: Path, top: Path) -> bytes:
    """The bytes of the file `name` in the folder open as `dir_fd`, once checked as a file of
    the workbook `top` (`trust.check_trusted`) and as a regular file (a FIFO would hang the
    read, a device never end it: an OSError saying what it is)."""
    fd = open_entry(dir_fd, name, path)
    try:
        check_trusted(path, fd, top)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    finally:
        os.close(fd)


def has_entry(dir_fd: int, name: str) -> bool:
    """Whether the folder open as `dir_fd` holds `name` (a link counts: it is refused later)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


@dataclass(eq=False)
class Pin:
    """A workbook's folder, or a package folder in it, and the files read from it: the top one
    held open while the workbook loads (`pinned`), any one reached and checked anew after."""

    path: Path
    top: Path  # the workbook's folder
    parent: Pin | None = None  # the folder it is in; None for the workbook's own
    fd: int | None = None
    files: dict[str, bytes] = field(default_factory=dict)  # name: the bytes read and checked

    @contextmanager
    def opened(self) -> Iterator[int]:
        """A descriptor of the folder: the one held, else one opened and checked for now."""
        if self.fd is not None:
            yield self.fd
            return
        if self.parent is None:
            fd = open_folder(self.path)  # checked, and every folder above it
        else:
            with self.parent.opened() as above:
                fd = open_entry(above, self.path.name, self.path, folder=True)
            try:
                check_trusted(self.path, fd, self.top)
            except BaseException:
                os.close(fd)
                raise
        try:
            yield fd
        finally:
            os.close(fd)

    def read(self, name: str) -> bytes:
        """The bytes of the file `name` here, read and checked once (`read_checked`): the same
        bytes every time after. FileNotFoundError when there is none."""
        if name not in self.files:
            with self.opened() as fd:
                self.files[name] = read_checked(fd, name, self.path / name, self.top)
        return self.files[name]

    def package(self, name: str) -> Pin | None:
        """The folder `name` here as a package of the workbook, its `__init__.py` read and
        checked; None when `name` is no folder holding an `__init__.py`."""
        with self.opened() as fd:
            try:
                inner = open_entry(fd, name, self.path / name, folder=True)
            except (FileNotFoundError, NotADirectoryError):
                return None
            pin = Pin(self.path / name, self.top, self, inner)
            try:
                if not has_entry(inner, "__init__.py"):
                    return None  # a folder, but no package
                check_trusted(pin.path, inner, self.top)
                pin.read("__init__.py")
            finally:
                pin.fd = None
                os.close(inner)
        return pin

    def find(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """The spec of the module `fullname` of this package, as Python's finders order it:
        a package folder first, then a `.py` file; None when neither is here."""
        name = fullname.rpartition(".")[2]
        if not name.isidentifier():
            return None
        package = self.package(name)
        if package is not None:
            return module_spec(fullname, package, "__init__.py")
        try:
            self.read(f"{name}.py")
        except FileNotFoundError:
            return None
        return module_spec(fullname, self, f"{name}.py")


class Checked(importlib.abc.InspectLoader):
    """A workbook's module compiled from the bytes read and checked (`Pin.read`), never from
    its path: no bytecode is read from the folder or written into it (a .pyc is trusted by the
    source's size and time, which a file swapped for another can share)."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path = data, path

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self.data)

    def get_code(self, fullname: str) -> types.CodeType:
        return self.source_to_code(self.data, str(self.path))


def module_spec(fullname: str, where: Pin, name: str) -> importlib.machinery.ModuleSpec:
    """The spec of the module `fullname` from the file `name` read in `where`: a package (its
    `__init__.py`) holds its folder's `Pin`, and an empty `__path__`."""
    package = name == "__init__.py"
    spec = importlib.machinery.ModuleSpec(fullname, Checked(where.read(name), where.path / name),
                                          origin=str(where.path / name), is_package=package,
                                          loader_state=where if package else None)
    spec.has_location = True  # __file__ names the file, as for any module
    return spec


class WorkbookFinder:
    """The finder of a workbook package's modules (`Pin.find`), first in `sys.meta_path`; it
    finds nothing for any other module (nor looks further than its name)."""

    @classmethod
    def find_spec(cls, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PACKAGE):
            return None
        parent = fullname.rpartition(".")[0]
        pin = getattr(getattr(sys.modules.get(parent), "__spec__", None), "loader_state", None)
        return pin.find(fullname) if parent and isinstance(pin, Pin) else None


def install_finder() -> None:
    """`WorkbookFinder` first in `sys.meta_path` (once)."""
    if WorkbookFinder not in sys.meta_path:
        sys.meta_path.insert(0, WorkbookFinder)


@contextmanager
def pinned(folder: Path) -> Iterator[Pin]:
    """The workbook `folder` (absolute, with no link in it) open and checked, with every folder
    above it, while the block runs (`open_folder`); its `Pin` serves later imports after."""
    pin = Pin(folder, folder, fd=open_folder(folder))
    try:
        yield pin
    finally:
        os.close(pin.fd)
        pin.fd = None
