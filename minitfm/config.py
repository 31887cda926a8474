"""The YAML config: a file (or a mapping) and KEY=VALUE overrides, loaded into one validated
`Config`.

The kernel of the package, with the modules it reads: `minitfm.schema` (the sections, their
keys and rules), `minitfm.overrides` (the KEY=VALUE form and its hints), `minitfm.catalog`
(the names of tasks and positional schemes), `minitfm.yamlfile` (the strict YAML reader) and
`minitfm.errors`. It needs no torch and never looks at the machine, so a config reads the same
everywhere; whether it fits this machine's memory is asked where a run starts
(`minitfm.run.limits`). Every public name of the schema and the overrides is importable from
here too, where the rest of the package takes them from.

A config's mistakes are said all at once, one problem a line (`ConfigError`): a file with two
wrong keys is fixed in one go, not in two rounds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from minitfm.errors import ConfigError, option, quote, shown_path
from minitfm.overrides import (
    check_given_once,
    field_type,
    key_hint,
    keys_named,
    parse_override,
    set_path,
    split_key_value,
)
from minitfm.schema import (
    BUILT_IN_CODES,
    EVAL_BATCH_SIZE,
    SEED_RANGE,
    Config,
    LogConfig,
    ModelConfig,
    Section,
    TaskConfig,
    TrainConfig,
    check_device,
    config_keys,
    parse_threads,
)
from minitfm.yamlfile import read_yaml

__all__ = [  # what the package imports from here (the schema's and the overrides' included)
    "BUILT_IN_CODES", "EVAL_BATCH_SIZE", "SEED_RANGE", "Config", "LogConfig", "ModelConfig",
    "Section", "TaskConfig", "TrainConfig", "check_device", "check_given_once", "config_keys",
    "field_type", "flatten", "key_hint", "keys_named", "load_config", "parse_override",
    "parse_threads", "refuse_named_workbook", "resolve_data_paths", "set_path",
    "split_key_value", "to_yaml", "validate",
]


def load_config(path: str | Path | dict | None = None, overrides: list = ()) -> Config:
    """Read a YAML file (or take a mapping of the same sections, or the built-in default when
    `path` is None) and apply overrides: `key=value` text, or (key, value) pairs from Python.
    A file (or mapping) may not name a workbook in model.code unless an override names the code
    too (see `refuse_named_workbook`)."""
    named = path is not None  # the code its model.code names, unless an override names one
    if isinstance(path, dict):
        data = copy.deepcopy(path)  # set_path writes into it
    else:
        data = read_yaml(Path(path)) if path is not None else {}
        if path is not None:
            resolve_data_paths(data, Path(path).parent)
    problems = []  # every wrong override and key, said at once
    for item in overrides:
        try:
            key, value = item if isinstance(item, tuple) else parse_override(item)
            set_path(data, key, value)
        except ConfigError as err:
            problems += err.problems()
            continue
        named = named and key != "model.code"
    if named:
        refuse_named_workbook(data, "the config given" if isinstance(path, dict) else
                              quote(str(path)))
    resolve_data_paths(data, Path.cwd())  # overrides name files from where you are
    try:
        cfg = validate(data)
    except ConfigError as err:
        problems += err.problems()
    if problems:
        raise ConfigError(*dict.fromkeys(problems))
    return cfg


def refuse_named_workbook(data: dict[str, Any], source: str) -> None:
    """A config file may name fast or book in model.code, never a workbook: a run folder, which
    can come from anyone, holds a config.yaml naming the workbook it trained, and `train` of that
    file would import its code. Only the command line names a workbook (`--book DIR`); from
    Python, `book=` (a mapping or a Config, a loaded run's say, is a config like a file)."""
    model = data.get("model")
    code = model.get("code") if isinstance(model, dict) else None
    if isinstance(code, str) and code and code not in BUILT_IN_CODES:
        shown = shown_path(code)
        raise ConfigError(f"{source} names the workbook {quote(shown)} (model.code), and a "
                          f"config never makes minitfm run code: give {option('book', shown)} "
                          f"(or model.code={shown}) to run its code")


def resolve_data_paths(data: dict[str, Any], base: Path) -> None:
    """task.train_path, task.eval_path and a workbook's model.code made absolute, relative ones
    read from `base`, so that a run's stored config.yaml names the same files from anywhere."""
    task, model = data.get("task"), data.get("model")
    for key in ("train_path", "eval_path"):
        if isinstance(task, dict) and isinstance(task.get(key), str) and task[key]:
            task[key] = str((base / Path(task[key]).expanduser()).resolve())
    code = model.get("code") if isinstance(model, dict) else None
    if isinstance(code, str) and code and code not in BUILT_IN_CODES:  # a workbook folder
        model["code"] = str((base / Path(code).expanduser()).resolve())


def validate(data: dict[str, Any]) -> Config:
    """Build a Config, turning pydantic's errors into readable lines, one per problem."""
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(*dict.fromkeys(_describe(err))) from None


def _describe(err: ValidationError) -> list[str]:
    messages = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            section = e["loc"][:-1]
            model = Config
            for part in section:
                model = model.model_fields[str(part)].annotation
            prefix = ".".join(str(p) for p in section)
            names = [f"{prefix}.{n}" if prefix else n for n in model.model_fields]
            messages.append(f"unknown config key '{loc}'{key_hint(loc, names)}")
        elif e["type"] == "value_error":
            messages.append(str(e["ctx"]["error"]))
        elif e["type"] == "model_type":
            messages.append(f"'{loc}' must be a mapping of keys, got {quote(e['input'])}")
        elif e["type"] == "string_unicode":  # a file or folder name in another encoding
            messages.append(f"{loc} ({quote(e['input'])}) is not a UTF-8 name (a byte of "
                            f"another encoding): a run writes it into its config; rename it "
                            f"in UTF-8")
        else:
            messages.append(f"{loc} ({quote(e['input'])}): {e['msg'].lower()}")
    return messages


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"d_model": 64}} -> {"model.d_model": 64}; None becomes "null"."""
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = "null" if value is None else value
    return flat


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML, in schema order."""
    return yaml.safe_dump(cfg.model_dump(), sort_keys=False)

