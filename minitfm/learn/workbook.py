"""A learner's workbook: the book's chapters with the exercises' bodies left to write.

`write_workbook` copies each chapter of `minitfm/book/` into a folder, with the book's file
names: every exercise keeps its name, signature and docstring, and its body becomes a hint and a
`NotImplementedError`; the chapters import each other from the folder, so the learner's
functions call the learner's functions. `load_workbook` imports such a folder as a package of its
own (never as `minitfm.book`) and fills each exercise still blank with the book's code, run in
the workbook's namespace: so a run can train with whatever the learner has written so far. It
imports only a workbook of the user's own (`trust`), every file read once through its folder
opened and checked (`pinned`), compiled from those bytes (no bytecode is read from it or written
into it); whatever the learner's code raises, at import or later (`learner_errors`), is one line
naming its file and line.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import stat
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

import minitfm.book
from minitfm.errors import MinitfmError, from_signal, quote
from minitfm.learn.exercises import BY_NAME, CHAPTERS, EXERCISES, Exercise
from minitfm.learn.pinned import PACKAGE, Pin, install_finder, module_spec, pinned

BOOK = Path(minitfm.book.__file__).parent
MARK = "minitfm-workbook.json"  # what makes a folder a workbook: its kind and the book it came from
BOOK_IMPORT = re.compile(r"^from minitfm\.book\.(\w+) import", re.MULTILINE)


class WorkbookError(MinitfmError):
    """A folder that is no workbook, or a workbook that does not import (exit 2)."""


def book_source(chapter: str) -> str:
    return (BOOK / f"{chapter}.py").read_text(encoding="utf-8")


def find_function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    """The definition of `name` (a function, or `Class.method`) at the top of a module."""
    owner, _, method = name.rpartition(".")
    body = tree.body
    if owner:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        body = classes[0].body if classes else []
    found = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == (method or name)]
    return found[0] if found else None


def body_start(node: ast.FunctionDef) -> int:
    """The line where the body after the docstring starts (1-based)."""
    first = node.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None),
                                                          ast.Constant)
    return node.body[1].lineno if has_doc and len(node.body) > 1 else first.lineno


def is_blank(node: ast.FunctionDef) -> bool:
    """True for a body that only raises NotImplementedError (after its docstring)."""
    body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value,
                                                                                 ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def function_digest(source: str, name: str) -> str:
    """A short hash of a function's text in a module (how the book's version is recognised)."""
    node = find_function(ast.parse(source), name)
    text = ast.get_source_segment(source, node) if node is not None else ""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def blank_text(exercise: Exercise, number: int, indent: str) -> list[str]:
    """The hint and the raise that replace an exercise's body."""
    width = 100 - len(indent) - 2
    hint = textwrap.wrap(f"Hint: {exercise.hint}", width)
    message = f"exercise {number} ({exercise.name}) is not written yet: see its hint"
    return [f"{indent}# {line}" for line in hint] + \
        [f"{indent}raise NotImplementedError({message!r})"]


def chapter_workbook(chapter: str) -> str:
    """A chapter's source with its exercises blank and its book imports made relative."""
    source = book_source(chapter)
    lines = source.splitlines()
    tree = ast.parse(source)
    todo = [(n, e) for n, e in enumerate(EXERCISES, 1) if e.chapter == chapter]
    for number, exercise in sorted(todo, key=lambda t: -find_function(tree, t[1].name).lineno):
        node = find_function(tree, exercise.name)
        start, end = body_start(node), node.end_lineno
        indent = re.match(r"\s*", lines[start - 1]).group(0)
        lines[start - 1:end] = blank_text(exercise, number, indent)
    return BOOK_IMPORT.sub(r"from .\1 import", "\n".join(lines) + "\n")


@functools.cache  # the installed book does not change while minitfm runs: once a process
def book_digests() -> dict[str, str]:
    """Each exercise's hash in the book of now (a workbook records those it was made from)."""
    return {e.name: function_digest(book_source(e.chapter), e.name) for e in EXERCISES}


def marker_text(kind: str) -> str:
    return json.dumps({"kind": kind, "book": book_digests()}, indent=1) + "\n"


def new_folder(folder: Path, what: str) -> list[Path]:
    """Claim `folder` for a workbook or zoo (made empty, with its missing parents); one that
    exists is never touched. The folders made, innermost first."""
    try:
        str(folder).encode("utf-8")
    except UnicodeEncodeError:
        raise WorkbookError(f"{quote(str(folder))} is not a UTF-8 name (a byte of another "
                            f"encoding): a workbook's name goes into its README and into the "
                            f"config of every run that trains it; choose a UTF-8 name (minitfm "
                            f"learn {what} DIR)") from None
    if folder.exists() or folder.is_symlink():
        raise WorkbookError(f"{quote(str(folder))} already exists: minitfm never writes over a "
                            f"learner's work; choose another folder (minitfm learn {what} DIR) "
                            f"or move that one away")
    made = [p for p in (folder, *folder.parents) if not (p.exists() or p.is_symlink())]
    try:
        folder.mkdir(parents=True)
    except OSError as err:
        raise WorkbookError(f"cannot create {quote(str(folder))}: {err.strerror}") from None
    return made


def write_folder(folder: Path, files: dict[str, str], kind: str, what: str) -> None:
    """`files` (name: text) and the mark of `kind` in the new `folder`, whole or not at all:
    written into a hidden sibling, renamed onto the empty folder claimed first (a full disk or
    an error midway removes what this made, so no half workbook is left in the way)."""
    made = new_folder(folder, what)
    staging = folder.parent / f".{folder.name}.{secrets.token_hex(4)}.tmp"
    try:
        staging.mkdir()
        for name, text in {**files, MARK: marker_text(kind)}.items():
            (staging / name).write_text(text, encoding="utf-8")
        os.rename(staging, folder)  # onto the empty folder: POSIX rename replaces it whole
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        for path in made:  # the folder claimed, then the parents made for it, while empty
            with contextlib.suppress(OSError):
                path.rmdir()
        if isinstance(err, OSError):
            raise WorkbookError(f"cannot write {quote(str(folder))} ({err.strerror or err}): "
                                f"nothing of it was left; free some space, or choose another "
                                f"folder") from None
        raise


def write_workbook(folder: Path, readme: str) -> list[Path]:
    """The chapters with blank exercises, a README and the mark, in a new folder."""
    files = {f"{chapter}.py": chapter_workbook(chapter) for chapter in CHAPTERS}
    files["__init__.py"] = '"""My workbook of the minitfm book (minitfm learn start)."""\n'
    files["README.md"] = readme
    write_folder(folder, files, "workbook", "start")
    return [folder / f"{chapter}.py" for chapter in CHAPTERS]


@dataclass
class Workbook:
    """A workbook imported: its chapters as modules, and which exercises the learner wrote."""

    folder: Path
    kind: str  # "workbook", or "zoo" (`minitfm learn bugs`)
    modules: dict[str, types.ModuleType]
    written: tuple[str, ...]  # exercises with a body of the learner's (blank ones run the book's)
    digest: str  # of the chapter files: a run records it
    made_from: dict[str, str]  # the book's exercise hashes when the workbook was made

    def function(self, exercise: Exercise) -> Callable:
        """The workbook's version of an exercise, as its module or class holds it."""
        return get_function(self.modules[exercise.chapter], exercise.name)

    def changed_in_book(self) -> list[str]:
        """Exercises the book has changed since this workbook was made."""
        now = book_digests()
        return [name for name, digest in now.items() if self.made_from.get(name) != digest]


def get_function(module: types.ModuleType, name: str) -> Callable:
    owner, _, method = name.rpartition(".")
    return vars(getattr(module, owner))[method] if owner else getattr(module, name)


def set_function(module: types.ModuleType, name: str, function: Callable) -> None:
    owner, _, method = name.rpartition(".")
    setattr(getattr(module, owner) if owner else module, method or name, function)


def rebind(function: Callable, namespace: dict) -> Callable:
    """`function`'s code run in `namespace` (its global names looked up there), decorated as
    it was: the book's code, calling whatever the workbook defines under the book's names."""
    inner = getattr(function, "__wrapped__", function)
    fresh = types.FunctionType(inner.__code__, namespace, inner.__name__, inner.__defaults__,
                               inner.__closure__)
    fresh.__kwdefaults__, fresh.__doc__ = inner.__kwdefaults__, inner.__doc__
    fresh.__qualname__ = inner.__qualname__
    return torch.no_grad()(fresh) if inner is not function else fresh  # the book's only wrapper


def read_file(path: Path) -> bytes:
    """The bytes of a workbook's file, only when it is a regular file (a FIFO would hang the
    read, a device never end it): else an OSError saying what it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open: no wait
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    finally:
        os.close(fd)


def read_marker(folder: Path, given: str) -> dict:
    """The mark of the workbook `folder` (`given` as the user wrote it), or one line saying
    what `given` is instead and what to give."""
    if not folder.is_dir():
        if given in BY_NAME:  # `minitfm learn check attention`: the folder left out
            raise WorkbookError(f"{quote(given)} is an exercise, not a folder: name the workbook "
                                f"first, e.g. minitfm learn check workbook {given}")
        if folder.exists():
            raise WorkbookError(f"{quote(given)} is a file, not a workbook: give the folder "
                                f"minitfm learn start made (e.g. workbook)")
        raise WorkbookError(f"{quote(given)} does not exist: make a workbook with minitfm learn "
                            f"start {given}, or give the folder it made")
    try:
        mark = json.loads(read_file(folder / MARK))
        assert mark["kind"] in ("workbook", "zoo") and isinstance(mark["book"], dict)
        return mark
    except (OSError, ValueError, KeyError, TypeError, AssertionError, RecursionError):
        raise WorkbookError(f"{quote(given)} is no minitfm workbook (no valid {MARK} in it): "
                            f"give the folder minitfm learn start made, or make one in a new "
                            f"folder (minitfm learn start DIR)") from None


def parse_chapters(folder: Path, read: Callable[[str], bytes] | None = None
                   ) -> dict[str, ast.Module]:
    """Each chapter's syntax tree, from the bytes `read(name)` gives (by default, the file in
    `folder`); a syntax error is one line naming its file and line."""
    trees = {}
    for chapter in CHAPTERS:
        path = folder / f"{chapter}.py"
        try:
            data = read(path.name) if read else read_file(path)
            trees[chapter] = ast.parse(data.decode("utf-8-sig"), str(path))
        except SyntaxError as err:
            raise syntax_error(path, err) from None
        except (OSError, UnicodeDecodeError) as err:
            why = err.strerror if isinstance(err, OSError) and err.strerror else err
            raise WorkbookError(f"cannot read {path}: {why}; every chapter of the book must be "
                                f"there ({', '.join(c + '.py' for c in CHAPTERS)})") from None
    return trees


def syntax_error(path: Path, err: SyntaxError) -> WorkbookError:
    """A syntax error in the chapter `path` as one line naming its file and line (a NUL byte,
    which Python places on no line, on the line of the first)."""
    line = err.lineno
    if line is None:
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            line = data[:data.find(b"\0")].count(b"\n") + 1 if b"\0" in data else None
    where = f"{path}:{line}" if line else str(path)
    return WorkbookError(f"{where}: syntax error: {err.msg}; fix that line (a fresh copy of the "
                         f"chapter: minitfm learn start another folder)")


def written_exercises(folder: Path, trees: dict[str, ast.Module]) -> tuple[str, ...]:
    """The exercises whose body is the learner's; a renamed or deleted one is an error."""
    written = []
    for exercise in EXERCISES:
        node = find_function(trees[exercise.chapter], exercise.name)
        if node is None:
            raise WorkbookError(f"{folder / exercise.file} has no {exercise.name} (exercise "
                                f"{exercise.name!r}): keep the book's names, so that the rest of "
                                f"the book can call it")
        if not is_blank(node):
            written.append(exercise.name)
    return tuple(written)


def check_kind(kind: str, written: tuple[str, ...], given: str) -> None:
    """A folder marked as a bug zoo holds no blank exercise: a zoo is the whole book, and a
    blank filled with the book's code would grade every planted bug as fixed."""
    blank = [e.name for e in EXERCISES if e.name not in written]
    if kind == "zoo" and blank:
        raise WorkbookError(f"{quote(given)} is marked as a bug zoo, but it holds blank exercises "
                            f"({', '.join(blank[:3])}{', ...' if len(blank) > 3 else ''}): a zoo "
                            f"is made by minitfm learn bugs; if this is a workbook, set \"kind\": "
                            f"\"workbook\" in its {MARK}")


def import_error(err: BaseException, folder: Path) -> WorkbookError:
    """One line for an error raised while importing the workbook: its file, line and kind (a
    syntax error that Python finds only as it compiles, at the chapter's own line)."""
    if isinstance(err, SyntaxError) and err.filename and in_folder(err.filename, folder):
        return syntax_error(Path(err.filename), err)
    frames = learner_frames(err, folder)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else str(folder)
    return WorkbookError(f"{where}: {error_text(err)} (while importing the workbook)")


def error_text(err: BaseException) -> str:
    """What the learner's code raised, in words: `Type: message`, or `your code called
    sys.exit(0)`; the type alone when the error's own message cannot be made."""
    if isinstance(err, SystemExit):
        code = err.code if isinstance(err.code, (int, str)) else None
        return f"your code called sys.exit({'' if code is None else quote(code)})"
    name = type(err).__name__
    try:
        text = str(err)
    except BaseException as failed:  # the learner's __str__: anything can happen there too
        if from_signal(failed):
            raise
        return f"{name} (its message could not be shown: its __str__ raised an error)"
    return f"{name}: {text}" if text else name


def in_folder(filename: str, folder: Path) -> bool:
    """Whether the file `filename` is one of `folder`'s own (a chapter, not the book's)."""
    return Path(filename).resolve().parent == folder.resolve()


def learner_frames(err: BaseException, folder: Path) -> list[traceback.FrameSummary]:
    """The frames of `err`'s traceback in the workbook `folder`'s files."""
    return [f for f in traceback.extract_tb(err.__traceback__) if in_folder(f.filename, folder)]


def digest_of(read: Callable[[str], bytes]) -> str:
    """A hash of the chapter files, as `read(name)` gives them (what a run records of the code
    it trained)."""
    sha = hashlib.sha256()
    for chapter in CHAPTERS:
        sha.update(read(f"{chapter}.py"))
    return sha.hexdigest()


def load_workbook(folder: str | Path) -> Workbook:
    """Import a workbook (or a zoo) as a package of its own; blank exercises run the book's."""
    given, folder = str(folder), Path(folder).resolve()
    mark = read_marker(folder, given)
    with pinned(folder) as pin:  # checked, and read from here on through this descriptor only
        trees = parse_chapters(folder, pin.read)
        written = written_exercises(folder, trees)
        check_kind(mark["kind"], written, given)
        digest = digest_of(pin.read)
        # A new name for every version of the files, and for every folder (two copies of one
        # workbook are two packages, each naming its own files in errors).
        version = hashlib.sha256(f"{folder}\0{digest}".encode("utf-8", "surrogateescape"))
        package = f"{PACKAGE}{version.hexdigest()[:16]}"
        try:
            modules = import_package(pin, package)
        except MinitfmError:  # ours: a file not the user's alone, say
            raise
        except BaseException as err:  # the learner's module code: anything can happen
            if from_signal(err):
                raise
            raise import_error(err, folder) from None
    for exercise in EXERCISES:
        if exercise.name not in written:
            fill(modules, exercise)
    return Workbook(folder, mark["kind"], modules, written, digest, mark["book"])


def fill(modules: dict[str, types.ModuleType], exercise: Exercise) -> None:
    """A blank exercise runs the book's code in the workbook's namespace, wherever the workbook
    holds it: its chapter, and the chapters that imported it by name (`from .model import
    greedy_decode`)."""
    module = modules[exercise.chapter]
    blank = get_function(module, exercise.name)
    book = importlib.import_module(f"minitfm.book.{exercise.chapter}")
    filled = rebind(get_function(book, exercise.name), vars(module))
    set_function(module, exercise.name, filled)
    for other in modules.values():
        for name, value in list(vars(other).items()):
            if value is blank:
                setattr(other, name, filled)


def import_package(pin: Pin, package: str) -> dict[str, types.ModuleType]:
    """The chapters of the workbook `pin` holds as modules of the package `package` (imported
    once a version), each compiled from the bytes read and checked (`pinned`)."""
    install_finder()
    if package not in sys.modules:
        try:
            spec = module_spec(package, pin, "__init__.py")
        except FileNotFoundError:
            raise WorkbookError(f"{pin.path / '__init__.py'} is missing: a workbook is a "
                                f"package; create the file (it may be empty)") from None
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[package]
            raise
    return {chapter: importlib.import_module(f"{package}.{chapter}") for chapter in CHAPTERS}


def prints_aside(aside: bool) -> contextlib.AbstractContextManager:
    """With `aside`, what the block prints to stdout goes to stderr (the learner's print()
    under --json, whose stdout is JSON lines only)."""
    return contextlib.redirect_stdout(sys.stderr) if aside else contextlib.nullcontext()


@contextmanager
def learner_errors(workbook: Workbook | None, json_out: bool = False) -> Iterator[None]:
    """While a workbook's code runs: whatever it raises (a shape error in the learner's
    attention, sys.exit, an exception of its own) becomes one line naming the file, line and
    function, instead of a traceback; with `json_out` (a command's --json), its print() goes
    to stderr, so that stdout stays JSON. A signal (Ctrl-C, SIGTERM) stays a signal."""
    with prints_aside(json_out and workbook is not None):
        try:
            yield
        except MinitfmError:
            raise
        except BaseException as err:
            frames = [] if workbook is None or from_signal(err) else \
                learner_frames(err, workbook.folder)
            if not frames:
                raise
            where = frames[-1]
            raise WorkbookError(f"{where.filename}:{where.lineno} in {where.name}: "
                                f"{error_text(err)} (your code; minitfm learn check "
                                f"{workbook.folder} tells which exercise and why)") from None
