"""Tiny configs and CLI helpers shared by the tests."""

from __future__ import annotations

import functools
import os
import re
from unittest import mock

import pytest
import typer
from typer.testing import CliRunner

from minitfm.app.cli import app

# A copy task small enough to learn in about a second on one CPU thread. Its model and lr are
# fixed here (not the default's), so that the tests' runs do not change with the default.
TINY = [
    "task.name=copy", "task.n_symbols=5", "task.max_len=6",
    "model.d_model=32", "model.n_heads=2", "model.n_encoder_layers=1",
    "model.n_decoder_layers=1", "model.d_ff=64", "model.tie_embeddings=true",
    "train.steps=200", "train.batch_size=64", "train.lr=3e-3", "train.warmup_steps=20",
    "train.eval_every=50",
    "train.eval_samples=200", "train.checkpoint_every=100", "log.log_every=10",
    "log.attention_every=0",
]
# TINY cut to 50 steps at a higher lr: it learns a little (exact match ~0.2), enough for the
# tests that read a run and need no fully trained model (the fast suite's shared runs).
QUICK = [*TINY, "train.steps=50", "train.warmup_steps=10", "train.lr=0.01"]


def command_names() -> list[str]:
    """The CLI's commands as Typer registers them: the name given, or the function's; then its
    groups of commands (`learn`). Hidden ones (`stack`, a sweep's building block) are not the
    face's: neither its help nor the README lists them."""
    return [info.name or info.callback.__name__.replace("_", "-")
            for info in app.registered_commands if not info.hidden] + \
        [info.name for info in app.registered_groups]


KEY_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*=")  # a config key's KEY=VALUE (not a path)


def once(items) -> list[str]:
    """`items` with each KEY=VALUE key given once, at its last place with its last value (other
    items as they are). The tests write a run's settings as TINY (QUICK, ...) followed by the
    keys they change, as a config file and its overrides would be; `train` and `sweep` refuse a
    key given twice on their command line."""
    items = [str(item) for item in items]
    keys = [found.group() if (found := KEY_VALUE.match(item)) else None for item in items]
    return [item for i, (item, key) in enumerate(zip(items, keys))
            if key is None or key not in keys[i + 1:]]


def given_once(args) -> list[str]:
    """A `train` or `sweep` command line with each key given once (`once`); another command's
    as it is. A test of the refusal invokes the command as typed: `run_cli(..., as_typed=True)`."""
    args = [str(a) for a in args]
    return once(args) if args and args[0] in ("train", "sweep") else args


def run_cli(*args: str, input: str | None = None, as_typed: bool = False):
    """Invoke the CLI in-process; stdout and stderr are kept apart. Each key given once
    (`given_once`) unless `as_typed`."""
    argv = [str(a) for a in args] if as_typed else given_once(args)
    with mock.patch("typer.testing._get_command", lambda _: app_command()):
        return CliRunner().invoke(app, argv, input=input)


@functools.cache
def app_command():
    """The Click command `app` makes, built once: Typer's runner builds it again at every
    invoke, every command's parameters read from its signature (~6 ms, a thousand times)."""
    return typer.main.get_command(app)


def assert_clean_error(result, code: int, *needles: str) -> None:
    """Exit `code`, one line on stderr naming the problem, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    message = result.stderr.strip()
    assert message.startswith("error: ") and "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)


def assert_clean_errors(result, code: int, *needles: str) -> None:
    """Exit `code`, no traceback, stderr a line per problem, each `error: ...`: as many lines
    as `needles`, the i-th naming the i-th (a config with several mistakes says them all)."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == len(needles), result.stderr
    for line, needle in zip(lines, needles):
        assert line.startswith("error: ") and needle in line, (needle, line)


def assert_error_line(result, code: int, *needles: str) -> None:
    """Exit `code`, no traceback, stderr's last line the error naming the problem (after any
    `note:` or `warning:` lines: the code a run trained, an exercise that fails its check)."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    *before, error = result.stderr.strip().splitlines()
    assert all(line.startswith(("note: ", "warning: ")) for line in before), result.stderr
    assert error.startswith("error: "), result.stderr
    for needle in needles:
        assert needle in error, (needle, error)


def missing(reason: str) -> None:
    """Skip a test for want of a tool this machine lacks (`reason` says how to get it); under
    MINITFM_CI=1, which .ci/run sets, fail instead: CI must run every test, never go green on a
    skip."""
    __tracebackhide__ = True  # the skip line names the test, not this helper
    if os.environ.get("MINITFM_CI") == "1":
        pytest.fail(f"MINITFM_CI=1 and {reason}", pytrace=False)
    pytest.skip(reason)


def train_bare(cfg, **options):
    """`run.session.start_training` with no instruments (the run's own files only: the quickest
    run); `options` are the fields of `RunOptions` (run_dir=, resume=, stop_at=, ...)."""
    from minitfm.run.session import RunOptions, start_training

    return start_training(cfg, RunOptions(**options))
