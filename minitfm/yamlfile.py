"""Reading YAML safely: the strict loader every config and run's config.yaml goes through.

YAML 1.1 (PyYAML's default) reads `017` as 15, `yes` as true and `3e-4` as a string; the 1.2
core schema, which `StrictLoader` follows, reads them as 17, 'yes' and 0.0003. A duplicate key
is an error, not a silent overwrite, and a chain of aliases that would stand for billions of
nodes in a few hundred bytes ("billion laughs") is refused before it is built. `read_yaml`
turns every way a config file can be wrong into one ConfigError line. No torch here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from minitfm.errors import ConfigError, quote

ALIAS_BUDGET = 10_000  # YAML nodes after expanding aliases; a real config has about 50
MAX_CONFIG_BYTES = 1_000_000  # a config is a few hundred bytes
YAML_12_SCALARS = (  # (tag, pattern, first characters): the 1.2 core schema's plain scalars
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
     list("tTfF")),
    ("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
     list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789.")),
)


def core_schema_resolvers() -> dict[str, list]:
    """SafeLoader's implicit resolvers with YAML 1.1's booleans and numbers replaced by 1.2's."""
    replaced = {tag for tag, _, _ in YAML_12_SCALARS}
    resolvers = {first: [(tag, rx) for tag, rx in found if tag not in replaced]
                 for first, found in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for tag, pattern, firsts in YAML_12_SCALARS:
        for first in firsts:
            resolvers.setdefault(first, []).append((tag, pattern))
    return resolvers


class StrictRules:
    """What makes a PyYAML safe loader strict: YAML 1.2 scalars, no duplicate keys and a bound
    on aliases."""

    yaml_implicit_resolvers = core_schema_resolvers()

    def construct_document(self, node):
        if expanded_size(node, {}) > ALIAS_BUDGET:
            raise yaml.YAMLError(f"its aliases (*name) expand to more than {ALIAS_BUDGET:,} "
                                 f"values; write the values out")
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key in seen and key != "<<":
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {quote(key)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_decimal_int(self, node) -> int:
        text = self.construct_scalar(node).replace("_", "")
        base = {"0x": 16, "0o": 8}.get(text[:2].lower(), 10)
        return int(text[2:] if base != 10 else text, base)

    yaml_constructors = {**yaml.SafeLoader.yaml_constructors,
                         "tag:yaml.org,2002:int": construct_decimal_int}


class StrictLoader(StrictRules, yaml.SafeLoader):
    """`safe_load` with YAML 1.2 scalars, no duplicate keys and a bound on aliases."""


def expanded_size(node, memo: dict[int, int]) -> int:
    """Nodes in `node` once every alias is written out (aliases share node objects)."""
    if id(node) not in memo:
        memo[id(node)] = 1  # a recursive alias counts once
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        memo[id(node)] = 1 + sum(expanded_size(child, memo) for child in children)
    return memo[id(node)]


def libyaml_caps_nesting() -> bool:
    """Whether PyYAML has libyaml, at 0.2.5 or later: it refuses YAML nested over 1000 levels
    deep, where a parser in C would run out of stack (Python's raises RecursionError)."""
    if not yaml.__with_libyaml__:
        return False
    try:
        yaml.load("[" * 1001 + "]" * 1001, Loader=yaml.CSafeLoader)
    except yaml.YAMLError:
        return True
    return False


if libyaml_caps_nesting():
    class FastStrictLoader(StrictRules, yaml.CSafeLoader):
        """StrictLoader's rules on libyaml's parser: about 6 times as fast, for the hundreds of
        run configs `minitfm runs` reads. Its words for a mistake are libyaml's (`did not find
        expected node content`)."""
else:
    FastStrictLoader = StrictLoader  # the same rules, parsed in Python


def load_yaml(text: str, fast: bool = False):
    """One YAML document read with `StrictLoader` (safe: no tags that run code); `fast`, with
    `FastStrictLoader` where libyaml is there to parse it."""
    return yaml.load(text, Loader=FastStrictLoader if fast else StrictLoader)


def error_line(err: yaml.MarkedYAMLError) -> int | str:
    """The line (from 1) a YAML error points at; '?' when it points nowhere."""
    return err.problem_mark.line + 1 if err.problem_mark else "?"


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file, read with `StrictLoader`; every mistake is a ConfigError."""
    shown = quote(str(path))
    if path.is_dir():
        raise ConfigError(f"config {shown} is a directory: give a YAML file such as "
                          f"configs/reverse.yaml")
    if not path.exists():
        raise ConfigError(f"config file {shown} not found: check the path (shipped configs are "
                          f"in configs/)")
    if not path.is_file():
        raise ConfigError(f"config {shown} is not a regular file: give a YAML file such as "
                          f"configs/reverse.yaml")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {shown} is {path.stat().st_size:,} bytes; a config is "
                          f"a few lines (at most {MAX_CONFIG_BYTES:,} bytes)")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        raise ConfigError(f"config file {shown} is not valid YAML at line {error_line(err)}: "
                          f"{err.problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {shown} is not valid YAML: {err}") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {shown} ({err.strerror})") from None
    except RecursionError:  # PyYAML builds nested collections recursively
        raise ConfigError(f"config file {shown} is nested too deeply: a config is sections of "
                          f"keys (task:, model:, train:, log:)") from None
    if data is None:
        raise ConfigError(f"config file {shown} is empty: state at least one key, e.g. "
                          f"'task: {{name: copy}}', or leave the config out for the default")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {shown} must be a mapping of sections "
                          f"(task:, model:, train:, log:), not a {type(data).__name__}")
    return data
