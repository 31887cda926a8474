"""Going on from a checkpoint: the config a resumed run trains with, and its state restored.

The checkpoint holds the config it was trained with. A resume takes it, applies the edits of the
run's config.yaml (read once) and then the KEY=VALUE overrides, prices the result against this
machine's memory (once), and refuses any change to task.* or model.*: those would change the
task or the weights. `model.code` alone may change: it picks which code runs the same weights.
A run that trained a learner's workbook goes on with the book's code unless the workbook is
asked for again (`--book DIR` or `model.code=DIR`): the run's own files never make minitfm
import code (see `learn.code`).

More steps on a cosine schedule stretch its decay to the new end, so the learning rate rises
again (a warm restart; see `schedule_jump`). A solved run would lose what it learned to that rise
and then stop at its target once more, so such a resume is refused, saying how to train it on at
the rate it had reached; any other run goes on, with a line that says the rate rises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minitfm.book.loop import lr_factor
from minitfm.config import (
    Config,
    TrainConfig,
    parse_override,
    resolve_data_paths,
    set_path,
    validate,
)
from minitfm.errors import CheckpointError, ConfigError, MinitfmError, option, shown_path
from minitfm.learn.code import is_workbook
from minitfm.run.checkpoint import check_vocab, checkpoint_mismatch
from minitfm.run.limits import check_fits, training_parts
from minitfm.run.rundir import find_run_dir
from minitfm.run.state import RunState
from minitfm.run.summary import DONE, read_summary
from minitfm.yamlfile import read_yaml

FIXED_SECTIONS = ("task", "model")  # what a resume may not change...
CHANGEABLE = ("model.code",)  # ...but for these keys: the code, not the weights


@dataclass(frozen=True)
class Resumed:
    """A run to go on with: its checkpoint, the config it trains with now, and the edits of its
    config.yaml in that config (those no KEY=VALUE overrode), for the note that says so."""

    checkpoint: dict[str, Any]
    cfg: Config
    edits: list[tuple[str, Any, Any]]
    code_note: str | None = None  # a workbook's run going on with the book's code: why
    schedule_note: str | None = None  # the learning rate rises on this resume: by how much
    nothing_left: str | None = None  # a run that ended with no step left to train: why


def resume_config(checkpoint: dict[str, Any], overrides: Sequence = (),
                  path: Path | None = None) -> Resumed:
    """The checkpoint's config with the edits of its run's config.yaml (see `config_edits`;
    `path` is the checkpoint file), then `overrides` (`key=value` text or (key, value) pairs)
    applied; task and model may not change (but `CHANGEABLE`)."""
    saved = checkpoint["config"]
    data = {section: dict(v) if isinstance(v, dict) else v for section, v in saved.items()}
    edits = config_edits(saved, path)
    for key, old, new in edits:
        if fixed(key):
            raise MinitfmError(f"{key} was edited in '{edited_file(path)}' ({old!r} -> "
                               f"{new!r}), but it cannot change on {option('resume')}: it "
                               f"would change the model or task; undo the edit, or start a new "
                               f"run with that config")
        set_path(data, key, new)
    for item in overrides:
        set_path(data, *(item if isinstance(item, tuple) else parse_override(item)))
    cfg = validate(data)
    check_ahead(checkpoint["step"], cfg.train.steps, path)
    check_fits(training_parts(cfg), "training")  # before anything is allocated or written
    for section in FIXED_SECTIONS:
        before, after = saved.get(section) or {}, getattr(cfg, section).model_dump()
        for key in before:
            if fixed(f"{section}.{key}") and before[key] != after[key]:
                raise MinitfmError(f"{section}.{key} cannot change on {option('resume')} "
                                   f"({before[key]!r} -> {after[key]!r}): it would change the "
                                   f"model or task; start a new run instead")
    given = {item[0] if isinstance(item, tuple) else item.partition("=")[0].strip()
             for item in overrides}  # a KEY=VALUE wins over the file
    code_note = None
    if is_workbook(cfg.model.code) and "model.code" not in given:  # not asked for: the book's
        code_note = (f"this run trained the code of the workbook {cfg.model.code}: it goes on "
                     f"with the book's code (give --book {cfg.model.code} to go on with yours)")
        cfg.model.code = "book"
    before = validate(saved).train
    done = nothing_left(checkpoint, before, cfg.train, path)
    schedule_note = None if done else schedule_jump(checkpoint, before, cfg.train, path)
    return Resumed(checkpoint, cfg, [edit for edit in edits if edit[0] not in given], code_note,
                   schedule_note, done)


def check_ahead(step: int, steps: int, path: Path | None) -> None:
    """train.steps may not fall behind the step the run has reached: its schedule and summary
    would say it finished steps it went past."""
    if steps < step:
        where = find_run_dir(path) or path if path is not None else "this run"
        raise MinitfmError(f"'{where}' is at step {step}: train.steps={steps} is behind it; give "
                           f"train.steps above {step} to train it on, or leave it out")


def nothing_left(checkpoint: dict[str, Any], before: TrainConfig, train: TrainConfig,
                 path: Path | None) -> str | None:
    """Why a run that ended (its summary.json says finished or stopped at target) has nothing
    left to train under `train`: no step left, or the target it reached still set and no step
    added to `before`, the checkpoint's (more steps on a solved run: `schedule_jump` says
    how); None when it has (or did not end: a resume then evaluates and writes its summary)."""
    run_dir = find_run_dir(path) if path is not None else None
    summary = read_summary(run_dir) if run_dir is not None else None
    if summary is None or summary["status"] not in DONE:
        return None
    step, best, target = checkpoint["step"], checkpoint.get("best_exact_match", -1.0), \
        train.target_exact_match
    reached = target is not None and best >= target
    if step < train.steps and not (reached and train.steps <= before.steps):
        return None
    why = (f"it reached its {target:.0%} target at step {step}" if reached
           else f"all {train.steps} steps")
    more = ("give a larger train.steps to train it on" if step >= train.steps
            else f"give train.target_exact_match=null to train it on to step {train.steps}")
    return f"nothing to do: this run has finished ({why}): {shown_path(run_dir)}; {more}"


def schedule_jump(checkpoint: dict[str, Any], before: TrainConfig, after: TrainConfig,
                  path: Path | None) -> str | None:
    """What a resume that raises the learning rate of its next step does (None: it does not).

    That rate is `lr * lr_factor(step, ...)` under `before`, the checkpoint's train config, and
    under `after`, the resumed one. A rise is refused for a run that reached its target (it
    would undo what the run learned) and said in a note for any other."""
    step = checkpoint["step"]
    was, will = before.lr * lr_factor(step, before), after.lr * lr_factor(step, after)
    if will <= was * 1.01:
        return None
    changes = ", ".join(f"train.{key} {getattr(before, key)} -> {getattr(after, key)}"
                        for key in ("steps", "warmup_steps", "schedule", "lr")
                        if getattr(before, key) != getattr(after, key))
    rise = f"{changes} sends the learning rate from {was:.3g} up to {will:.3g} at step {step}"
    # the suggestion is a whole command: with it, the new train.steps the user asked for
    more = f"train.steps={after.steps} " if after.steps != before.steps else ""
    constant = f"{more}train.schedule=constant train.lr={was:.3g}" if was > 0 else None
    best, target = checkpoint.get("best_exact_match", -1.0), before.target_exact_match
    if target is not None and best >= target:
        where = find_run_dir(path) or path if path is not None else "this run"
        how = (f"give {constant} (and train.target_exact_match=null to go past the target), or "
               if constant else "")
        raise MinitfmError(f"'{where}' reached its {target:.0%} target ({best:.1%}), and {rise}, "
                           f"which undoes what it learned; to train it on, {how}start a new run "
                           f"with train.steps={after.steps}")
    instead = f"; to go on at the rate it had reached instead, give {constant}" if constant else ""
    return f"{rise} (a warm restart: exact match may fall before it climbs again){instead}"


def fixed(key: str) -> bool:
    """Whether the dotted `key` may not change on resume."""
    return key.split(".")[0] in FIXED_SECTIONS and key not in CHANGEABLE


def edited_file(checkpoint: Path | None) -> Path | None:
    """The config.yaml of the run holding `checkpoint` (None: a loose file, or no such file)."""
    run_dir = find_run_dir(checkpoint) if checkpoint is not None else None
    path = run_dir / "config.yaml" if run_dir is not None else None
    return path if path is not None and path.is_file() else None


def config_edits(saved: dict[str, Any], checkpoint: Path | None) -> list[tuple[str, Any, Any]]:
    """(key, checkpoint's value, file's value) for each key the run's config.yaml states
    otherwise than the checkpoint's config `saved` does: a hand edit, or the overrides of a
    resume killed before its first save. Resume rewrites the file: an edit is applied or
    refused, never silently lost."""
    path = edited_file(checkpoint)
    if path is None:
        return []
    instead = "or remove it to continue with the checkpoint's config"
    try:
        data = read_yaml(path)
    except ConfigError as err:
        raise ConfigError(*(f"{problem} (read on resume: fix the file, {instead})"
                            for problem in err.problems())) from None
    resolve_data_paths(data, path.parent)  # as load_config reads a config file
    try:
        stated = validate(data).model_dump()
    except ConfigError as err:
        raise ConfigError(*(f"run config '{path}' (read on resume): {problem}; fix the file, "
                            f"{instead}" for problem in err.problems())) from None
    before = validate(saved).model_dump()  # every key, also one an older checkpoint lacks
    changed = [(key, lookup(before, key), lookup(stated, key)) for key in stated_keys(data)]
    return [(key, old, new) for key, old, new in changed if old != new]


def stated_keys(data: dict[str, Any]) -> list[str]:
    """The dotted keys a config file states (a key left out is no edit): `seed`, `train.steps`."""
    keys = []
    for name, value in data.items():
        keys += [f"{name}.{key}" for key in value] if isinstance(value, dict) else [name]
    return keys


def lookup(data: dict[str, Any], key: str) -> Any:
    """`data["a"]["b"]` for the dotted `key` "a.b"."""
    for part in key.split("."):
        data = data[part]
    return data


def edits_note(edits: list[tuple[str, Any, Any]], run_dir: Path) -> str:
    """What a resume took from the run's config.yaml rather than from the checkpoint."""
    changes = ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in edits)
    return (f"'{run_dir / 'config.yaml'}' differs from the checkpoint's config: continuing "
            f"with its {changes}")


def restore(state: RunState, checkpoint: dict[str, Any], path: Path) -> None:
    """Load a checkpoint into a fresh state; a mismatch is the checkpoint's fault, not a bug."""
    # The data first: pairs files that gained a symbol changed the vocabulary too, and the
    # files, not this minitfm version, are the cause.
    for key, value in state.task.checkpoint_data().items():
        if checkpoint.get(key) != value:  # pairs: files changed since the checkpoint
            raise CheckpointError(f"checkpoint '{path}' was trained on other data than "
                                  f"task.train_path and task.eval_path hold now: resuming "
                                  f"would change the task; start a new run")
    check_vocab(checkpoint, state.task, path)
    try:
        state.load_state_dict(checkpoint)
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as err:
        raise checkpoint_mismatch(path, err) from None
