"""The YAML config: schema, loading, key=value overrides and validation.

The kernel of the package, with the modules it reads: `minitfm.catalog` (the names of tasks and
positional schemes it validates against), `minitfm.yamlfile` (the strict YAML reader) and
`minitfm.errors`. It needs no torch and never looks at the machine, so a config reads the same
everywhere; whether it fits this machine's memory is asked where a run starts
(`minitfm.run.limits`).

Every key has a default, so a YAML file states only what it changes. The YAML key, the
pydantic field and the override path are the same string: `model.n_heads: 4` in a file is
`model.n_heads=4` on the command line.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

import minitfm.catalog as catalog
from minitfm.catalog import POSITIONALS, TASKS, check_device, modadd_problem, parse_threads
from minitfm.errors import ConfigError, option, quote, shown_path
from minitfm.yamlfile import load_yaml, read_yaml

BUILT_IN_CODES = ("fast", "book")  # model.code's own values: any other names a workbook folder
PAIRS_KEYS = {"train_path": None, "eval_path": None, "eval_fraction": 0.1, "tokenize": "char"}

SEED_RANGE = {"ge": -(2**63), "le": 2**63 - 1}  # what torch.manual_seed takes, less room for +rank
# Sequences decoded at once by default (book/metrics.py's `evaluate` and `predict`, `--batch-size`
# of eval and ablate): on a CPU 250 is as fast as 1000 (the matmuls are already large) and needs a
# quarter of the memory (1000 added ~120 MB to a training run's peak). Stated here, below the
# book, so that `--help` and `minitfm sweep` read it without torch.
EVAL_BATCH_SIZE = 250
FINITE = {"allow_inf_nan": False}
# Where the positional schemes come from: "sinusoidal: Vaswani et al. 2017; rope: ...".
ORIGINS = "; ".join(f"{spec.name}: {spec.origin}" for spec in POSITIONALS.values() if spec.origin)


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated.

    Strict: a YAML `true` is no integer and `5` no string (no silent coercions).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class TaskConfig(Section):
    """Which task to learn (synthetic, or pairs read from files), on which sequence lengths."""

    name: str = Field("reverse", description=f"task name: {', '.join(TASKS)}")
    n_symbols: int = Field(10, ge=2, le=100_000,
                           description="number of data symbols (digits 0..n_symbols-1)")
    min_len: int = Field(1, ge=1, le=65_536, description="shortest input length in training")
    max_len: int = Field(16, ge=1, le=65_536, description="longest input length in training "
                         "(pairs: longest source trained on, default model.max_len)")
    eval_seed: int = Field(1234, **SEED_RANGE, description="seed of the held-out evaluation set")
    train_fraction: float = Field(catalog.MODADD_TRAIN_FRACTION, **FINITE, description="modadd "
                                  "only: the share of the p² pairs trained on (drawn by eval_seed)")
    train_path: str | None = Field(
        None, description="pairs: training pairs, .tsv (source<TAB>target) or .jsonl "
        "({\"source\": ..., \"target\": ...}); relative to the config file's folder")
    eval_path: str | None = Field(
        None, description="pairs: held-out pairs, same formats (null: a share of train_path)")
    eval_fraction: float = Field(0.1, gt=0.0, lt=1.0, **FINITE, description="pairs without "
                                 "eval_path: share of train_path held out (by a hash of the "
                                 "source)")
    tokenize: Literal["char", "space"] = Field(
        "char", description="pairs: char (each character a symbol) or space (whitespace-"
        "separated words)")

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.name not in TASKS:
            hint = _did_you_mean(self.name, TASKS)
            raise ValueError(f"task.name ({quote(self.name)}) is not a task; choose one of "
                             f"{', '.join(TASKS)}{hint}")
        self._check_pairs_keys()
        if self.name == "pairs" and "max_len" not in self.model_fields_set:
            return self  # Config sets it to model.max_len, then this runs again
        if self.name == "modadd" and "max_len" not in self.model_fields_set:
            self.max_len = 1  # two one-symbol numbers; this runs again, with it set
        if self.min_len > self.max_len:
            raise ValueError(f"task.min_len ({self.min_len}) must be <= task.max_len "
                             f"({self.max_len})")
        if self.name == "add" and self.n_symbols > 10:
            raise ValueError(f"task.n_symbols ({self.n_symbols}) must be at most 10 for task "
                             f"'add': its symbols are the digits of base n_symbols")
        if (problem := modadd_problem(self)) is not None:
            raise ValueError(problem)
        return self

    def _check_pairs_keys(self) -> None:
        """The keys of task pairs only with it; n_symbols not with it (its data has symbols)."""
        if self.name != "pairs":
            for key, default in PAIRS_KEYS.items():
                if getattr(self, key) != default:
                    raise ValueError(f"task.{key} ({quote(getattr(self, key))}) applies only "
                                     f"to task 'pairs' (task.name is {quote(self.name)})")
            return
        if self.n_symbols != 10:
            raise ValueError(f"task.n_symbols ({self.n_symbols}) does not apply to task "
                             f"'pairs': its symbols are those of task.train_path")
        if self.train_path is None:
            raise ValueError("task 'pairs' needs task.train_path: a .tsv file of "
                             "source<TAB>target lines or a .jsonl file of "
                             "{\"source\": ..., \"target\": ...} lines")
        if self.eval_path is not None and self.eval_fraction != PAIRS_KEYS["eval_fraction"]:
            raise ValueError(f"task.eval_fraction ({self.eval_fraction}) applies only without "
                             f"task.eval_path: the held-out pairs are task.eval_path's")
        for key in ("train_path", "eval_path"):
            path = getattr(self, key)
            if path is not None and not path.lower().endswith((".tsv", ".jsonl")):
                raise ValueError(f"task.{key} ({quote(path)}) must end in .tsv "
                                 f"(source<TAB>target) or .jsonl (JSON lines)")


class ModelConfig(Section):
    """The encoder-decoder transformer (names from Vaswani et al. 2017)."""

    d_model: int = Field(64, ge=1, le=65_536, description="width of the residual stream")
    n_heads: int = Field(4, ge=1, le=1024,
                         description="attention heads (d_head = d_model / n_heads)")
    n_encoder_layers: int = Field(1, ge=1, le=256, description="encoder layers")
    n_decoder_layers: int = Field(2, ge=1, le=256, description="decoder layers")
    d_ff: int = Field(256, ge=1, le=262_144, description="hidden width of the feed-forward block")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, **FINITE,
                           description="dropout probability in [0, 1)")
    norm_first: bool = Field(True, description="pre-LN (true) or post-LN (false)")
    positional: str = Field(
        "sinusoidal", description=f"positional encoding: {', '.join(POSITIONALS)} ({ORIGINS})")
    random_positions: int | None = Field(
        None, ge=2, le=65_536, description="randomized positions (after Ruoss et al. 2023): in "
        "training, positions are a sorted random subset of [0, this); evaluation uses 0..n-1; "
        "null = off")
    tie_embeddings: bool = Field(False, description="share input embedding and output projection")
    max_len: int = Field(256, ge=2, le=65_536,
                         description="longest sequence (tokens) the model can take")
    code: str = Field(
        "fast", min_length=1, max_length=4096, description="which code the model runs, the same "
        "weights either way: fast (the book's model with the speed appendix's kernels and "
        "packing, minitfm/fast/), book (the book's own readable code, slower), or a workbook "
        "folder of minitfm learn (your functions where written, the book's elsewhere; "
        "`train --book DIR` sets it; only the command line may name one, never a config file)")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.positional not in POSITIONALS:
            # A scheme's other name (RoPE is "rotary" in the paper) gets a hint of its own.
            alias = next((s.name for s in POSITIONALS.values()
                          if str(self.positional).lower() in s.aliases), None)
            hint = f" (did you mean '{alias}'?)" if alias else _did_you_mean(self.positional,
                                                                              POSITIONALS)
            raise ValueError(f"model.positional ({quote(self.positional)}) must be one of "
                             f"{', '.join(POSITIONALS)}{hint}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by "
                             f"model.n_heads ({self.n_heads})")
        if POSITIONALS[self.positional].even_head and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"model.positional {self.positional} turns pairs of features: "
                             f"d_head = model.d_model / model.n_heads "
                             f"({self.d_model // self.n_heads}) must be even")
        self._check_random_positions()
        return self

    def _check_random_positions(self) -> None:
        n = self.random_positions
        if n is None:
            return
        spec = POSITIONALS[self.positional]
        if not spec.has_positions:
            some = [s.name for s in POSITIONALS.values() if s.has_positions]
            raise ValueError(f"model.random_positions ({n}) needs positions to randomize: set "
                             f"model.positional to {', '.join(some[:-1])} or {some[-1]}, or "
                             f"model.random_positions=null")
        if spec.learned and n > self.max_len:
            raise ValueError(f"model.random_positions ({n}) must be <= model.max_len "
                             f"({self.max_len}), the number of learned positions")


class TrainConfig(Section):
    """Optimisation (AdamW), schedule, evaluation and checkpoint cadence."""

    steps: int = Field(280, ge=1, le=10**9, description="optimizer steps in total")
    batch_size: int = Field(128, ge=1, le=1_048_576, description="sequences per step")
    lr: float = Field(1e-2, gt=0.0, **FINITE, description="peak learning rate")
    warmup_steps: int = Field(80, ge=0, le=10**9, description="linear warmup steps")
    schedule: Literal["cosine", "constant", "inverse_sqrt"] = Field(
        "cosine", description="lr after warmup: cosine, constant or inverse_sqrt")
    weight_decay: float = Field(0.01, ge=0.0, **FINITE, description="AdamW weight decay")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, **FINITE,
                                   description="label smoothing in [0, 1)")
    grad_clip: float | None = Field(1.0, gt=0.0, **FINITE,
                                    description="max gradient norm (null = off)")
    eval_every: int = Field(100, ge=0, le=10**9, description="steps between evaluations (0 = off)")
    eval_samples: int = Field(1000, ge=1, le=100_000,
                              description="held-out sequences per evaluation")
    check_every: int = Field(
        10, ge=0, le=10**9, description="steps between quick checks (greedy exact match on the "
        "first fifth of the held-out sequences) once an evaluation reached two thirds of the "
        "target; a check that sees the target calls a full evaluation at once (0 = off)")
    target_exact_match: float | None = Field(
        0.99, gt=0.0, le=1.0, **FINITE, description="stop early at this exact match (null = never)")
    checkpoint_every: int = Field(
        500, ge=0, le=10**9, description="steps between last.pt saves, which also follow every "
        "evaluation (0 = after evaluations and at the end only)")


class LogConfig(Section):
    """Where runs go and what they log."""

    dir: str = Field("runs", description="folder that holds the run directories")
    log_every: int = Field(25, ge=1, le=10**9, description="steps between train log lines")
    tensorboard: bool = Field(True, description="write TensorBoard event files")
    attention_every: int | Literal["eval"] = Field(
        25, description="steps between attention snapshots (TensorBoard's attention images "
        "and per-head scores, attention.jsonl): a number of steps (the default, 25, shows the "
        "maps form), eval (at every evaluation), or 0 (off)")
    attention_record: bool = Field(
        True, description="write each attention snapshot to attention.jsonl: the probe's "
        "cross-attention maps, each head's alignment score and entropy (what "
        "visualize-attention --over-training draws)")
    gauge_every: int = Field(
        10, ge=0, le=10**9, description="steps between readings of the gauges (what moves "
        "inside the model while exact match sits flat: alignment, token accuracy by position, "
        "the hardest positions' loss, weight norm; and the forecast made from them): in "
        "metrics.jsonl, TensorBoard and the progress line (0 = off)")

    @field_validator("attention_every", mode="before")
    @classmethod
    def _attention_every(cls, value: Any) -> Any:
        """`eval` or a step count: one clear message instead of pydantic's two."""
        steps = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10**9
        if value == "eval" or steps:
            return value
        raise ValueError(f"log.attention_every ({quote(value)}) must be eval (at every "
                         f"evaluation), a number of steps, or 0 (off)")


class Config(Section):
    """A whole minitfm run."""

    name: str = Field("reverse", description="run name, prefix of the run directory")
    seed: int = Field(0, **SEED_RANGE, description="seed of model initialisation and training data")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    threads: int | str = Field(
        "auto", description="CPU threads: auto (fastest alone, shared with other minitfm "
        "processes; may change during a run) or a fixed count (bit-exact CPU results)")
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    log: LogConfig = LogConfig()

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        """`name: 2024` in a file is meant as text, as `name=2024` is on the command line."""
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        return str(value) if numeric else value

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> int | str:
        return parse_threads(value)

    @model_validator(mode="after")
    def _check(self) -> Config:
        check_device(self.device, ValueError)
        if self.task.name == "pairs" and "max_len" not in self.task.model_fields_set:
            self.task.max_len = self.model.max_len  # lengths come from the data: all that fit
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", self.name):
            raise ValueError(f"name ({quote(self.name)}) may hold only letters, digits, '_', "
                             f"'-', '.' (at most 100)")
        n = self.model.random_positions
        if n is not None and n <= self.task.max_len:
            # Sampling n positions from [0, n) is no randomization; training on longer inputs
            # than the range is impossible. The exact need (BOS, add's '+') is checked at run
            # time, by catalog.position_shortfall.
            raise ValueError(f"model.random_positions ({n}) must exceed task.max_len "
                             f"({self.task.max_len}): pick a range that covers the test lengths, "
                             f"e.g. {4 * self.task.max_len}")
        return self


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
    for item in overrides:
        key, value = item if isinstance(item, tuple) else parse_override(item)
        set_path(data, key, value)
        named = named and key != "model.code"
    if named:
        refuse_named_workbook(data, "the config given" if isinstance(path, dict) else
                              quote(str(path)))
    resolve_data_paths(data, Path.cwd())  # overrides name files from where you are
    return validate(data)


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


def validate(data: dict[str, Any]) -> Config:
    """Build a Config, turning pydantic's errors into one readable line."""
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, data)) from None


def _describe(err: ValidationError, data: dict[str, Any]) -> str:
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
    more = f" (and {len(messages) - 1} more)" if len(messages) > 1 else ""
    return messages[0] + more


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def config_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every setting's dotted key: `name`, `seed`, ..., `task.name`, ..., `log.dir`."""
    keys = []
    for name, info in (model or Config).model_fields.items():
        kind = info.annotation
        is_section = isinstance(kind, type) and issubclass(kind, Section)
        keys += config_keys(kind, f"{prefix}{name}.") if is_section else [f"{prefix}{name}"]
    return keys


def keys_named(name: str) -> list[str]:
    """The dotted keys whose last part is `name`: `steps` -> train.steps; `max_len` -> two."""
    return [key for key in config_keys() if key.rpartition(".")[2] == name]


def key_hint(where: str, names: list[str]) -> str:
    """` (did you mean ...?)` for an unknown key: a name close to it beside it (`names`); for a
    bare name, first the keys of that name in any section (`steps` -> `train.steps`), then
    those of a name close to it (`step`)."""
    beside = _did_you_mean(where, names)
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

