"""KEY=VALUE overrides: how the command line sets a config key, and the hints when it cannot.

`train.steps=500` sets the key `train.steps` of the schema (`minitfm.schema`) to the YAML value
500; a key the schema lacks is refused with the key it most likely meant (`key_hint`), and a key
given twice on one command line is refused too (`check_given_once`): the last one would win
without a word. A kernel module: no torch.
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml

from minitfm.errors import ConfigError, quote
from minitfm.schema import Config, Section, config_keys, did_you_mean
from minitfm.yamlfile import load_yaml


def split_key_value(item: str) -> tuple[str, str] | None:
    """`key=value` as (the key, stripped; the value's text); None without `=` or a key."""
    key, sep, text = item.partition("=")
    key = key.strip()
    return (key, text) if sep and key else None


def parse_override(item: str) -> tuple[str, Any]:
    """Split `key=value`; the value is a YAML 1.2 scalar (`null` is None, `3e-4` a number),
    except for text keys such as `name`, which take the text as written (`name=2024`)."""
    split = split_key_value(item)
    if split is None:
        raise ConfigError(f"override {quote(item)} must look like key=value, e.g. "
                          f"train.steps=500")
    key, text = split
    if field_type(key) is str:  # as written, less YAML quotes: name=2024, name='"2024"'
        text = text.strip()
        quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
        return key, text[1:-1] if quoted else text
    try:
        value = load_yaml(text) if text.strip() else ""
    except (yaml.YAMLError, RecursionError):  # not one YAML value: the text itself
        value = text
    if isinstance(value, (dict, list)):
        raise ConfigError(f"override {quote(item)} must set a single value, not a "
                          f"{type(value).__name__}")
    return key, value


def check_given_once(items: list, sweep: bool = False) -> None:
    """Refuse a key that `items` (KEY=VALUE texts; other items are let be) give more than once:
    `train.steps=2 train.steps=3` would train 3 steps without a word. One problem per key
    (see `ConfigError`); a `sweep` hints at one item listing every value."""
    given: dict[str, list[str]] = {}
    for item in items:
        split = split_key_value(item) if isinstance(item, str) else None
        if split is not None:
            given.setdefault(split[0], []).append(split[1].strip())
    problems = []
    for key, texts in given.items():
        if len(texts) < 2:
            continue
        times = "twice" if len(texts) == 2 else f"{len(texts)} times"
        values = (" and " if any("," in text for text in texts) else ", ").join(texts)
        listed = ",".join(dict.fromkeys(v.strip() for text in texts for v in text.split(",")))
        fix = f"; to sweep it, list its values in one item: {key}={listed}" if sweep else ""
        problems.append(f"{key} is given {times} ({values}): give it once{fix}")
    if problems:
        raise ConfigError(*problems)


def field_type(key: str):
    """The annotation of the dotted config `key`, or None if there is no such key."""
    model: Any = Config
    for part in key.split("."):
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return None
        model = fields[part].annotation
    return model


def set_path(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `data["a"]["b"] = value` for the dotted `key` "a.b", checking the key exists."""
    parts = key.split(".")
    node, model = data, Config
    for depth, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:depth + 1])
            prefix = ".".join(parts[:depth])
            names = [f"{prefix}.{name}" if prefix else name for name in fields]
            raise ConfigError(f"unknown config key '{where}'{key_hint(where, names)}")
        annotation = fields[part].annotation
        is_section = isinstance(annotation, type) and issubclass(annotation, Section)
        last = depth == len(parts) - 1
        if is_section and last:
            raise ConfigError(f"'{key}' is a section: set one of its keys, e.g. "
                              f"{key}.{next(iter(annotation.model_fields))}=...")
        if not is_section and not last:
            raise ConfigError(f"'{'.'.join(parts[:depth + 1])}' is a key, not a section")
        if last:
            node[part] = value
            return
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"'{'.'.join(parts[:depth + 1])}' must be a mapping in the config")
        node, model = child, annotation


def keys_named(name: str) -> list[str]:
    """The dotted keys whose last part is `name`: `steps` -> train.steps; `max_len` -> two."""
    return [key for key in config_keys() if key.rpartition(".")[2] == name]


def key_hint(where: str, names: list[str]) -> str:
    """` (did you mean ...?)` for an unknown key: a name close to it beside it (`names`); for a
    bare name, first the keys of that name in any section (`steps` -> `train.steps`), then
    those of a name close to it (`step`)."""
    beside = did_you_mean(where, names)
    if "." in where:
        return beside
    found = keys_named(where)
    if not found and beside:
        return beside
    if not found:
        leaves = list(dict.fromkeys(key.rpartition(".")[2] for key in config_keys()))
        close = difflib.get_close_matches(where, leaves, n=1, cutoff=0.6)
        found = keys_named(close[0]) if close else []
    return f" (did you mean {' or '.join(repr(key) for key in found)}?)" if found else ""
