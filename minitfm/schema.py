"""The YAML config's schema: its sections, their keys with defaults and bounds, and the rules
that hold between keys.

Every key has a default, so a YAML file states only what it changes. The YAML key, the
pydantic field and the override path are the same string: `model.n_heads: 4` in a file is
`model.n_heads=4` on the command line (`minitfm.overrides` reads that form, `minitfm.config`
loads a whole config). Two keys' rules serve the command line too: `parse_threads` (`--threads`)
and `check_device` (`bench --device`). A kernel module: no torch, and nothing of the machine.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minitfm.catalog import POSITIONALS, TASKS
from minitfm.errors import ConfigError, quote

BUILT_IN_CODES = ("fast", "book")  # model.code's own values: any other names a workbook folder
PAIRS_KEYS = {"train_path": None, "eval_path": None, "eval_fraction": 0.1, "tokenize": "char"}

SEED_RANGE = {"ge": -(2**63), "le": 2**63 - 1}  # what torch.manual_seed takes, less room for +rank
# Sequences decoded at once by default (book/metrics.py's `evaluate` and `predict`, `--batch-size`
# of eval and ablate): on a CPU 250 is as fast as 1000 (the matmuls are already large) and needs a
# quarter of the memory (1000 added ~120 MB to a training run's peak). Stated here, below the
# book, so that `--help` and `minitfm sweep` read it without torch.
EVAL_BATCH_SIZE = 250
FINITE = {"allow_inf_nan": False}
TRACKING_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+")  # log.mlflow: a scheme, then the rest
MODADD_TRAIN_FRACTION = 0.3  # Nanda et al. 2023 train on 30% of the pairs
MODADD_MAX_SYMBOLS = 1000  # modadd lists its p² pairs (a million at most)
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
    train_fraction: float = Field(MODADD_TRAIN_FRACTION, **FINITE, description="modadd "
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
            hint = did_you_mean(self.name, TASKS)
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


def modadd_problem(task: TaskConfig) -> str | None:
    """What is wrong with modadd's settings (`task`, a TaskConfig), in one line; None: nothing.
    task.train_fraction is modadd's alone; modadd's lengths are 1 (two one-symbol numbers), and
    its share of the p² pairs trained on (rounded) must leave a pair on each side."""
    p, fraction = task.n_symbols, task.train_fraction
    if task.name != "modadd":
        return None if fraction == MODADD_TRAIN_FRACTION else (
            f"task.train_fraction ({fraction}) applies only to task 'modadd' (task.name is "
            f"{quote(task.name)})")
    if p > MODADD_MAX_SYMBOLS:
        return (f"task.n_symbols ({p}) must be at most {MODADD_MAX_SYMBOLS} for task 'modadd': "
                f"its p² pairs are listed in memory")
    if (task.min_len, task.max_len) != (1, 1):
        return (f"task.min_len ({task.min_len}) and task.max_len ({task.max_len}) do not apply "
                f"to task 'modadd' (each operand is one symbol): leave them out")
    if not 0 < fraction < 1:
        return (f"task.train_fraction ({fraction}) must be between 0 and 1: the share of the "
                f"p² pairs trained on, e.g. {MODADD_TRAIN_FRACTION}")
    trained = round(fraction * p * p)
    if trained < 1:
        return (f"task.train_fraction ({fraction}) trains on no pair of the {p * p} "
                f"(task.n_symbols {p}, squared): raise it to at least {1 / p**2:.3g}")
    if trained > p * p - 1:
        return (f"task.train_fraction ({fraction}) trains on every pair of the {p * p} "
                f"(task.n_symbols {p}, squared): lower it to at most {1 - 1 / p**2:.3g}")
    return None


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
            hint = f" (did you mean '{alias}'?)" if alias else did_you_mean(self.positional,
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
    mlflow: bool | str | None = Field(
        None, description="log the run to MLflow (docs/experiments.md#mlflow): a tracking URI "
        "(http://127.0.0.1:5000, sqlite:///mlflow.db), true (the URI in MLFLOW_TRACKING_URI) or "
        "null (off)")

    @field_validator("mlflow", mode="before")
    @classmethod
    def _mlflow(cls, value: Any) -> Any:
        """A URI (a scheme, then the rest), true, false or null: one line for anything else."""
        if value is None or isinstance(value, bool) or \
                (isinstance(value, str) and TRACKING_URI.fullmatch(value)):
            return value
        raise ValueError(f"log.mlflow ({quote(value)}) must be a tracking URI such as "
                         f"http://127.0.0.1:5000 or sqlite:///mlflow.db, true (the URI in "
                         f"MLFLOW_TRACKING_URI) or null (off)")

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


def did_you_mean(word: str, choices) -> str:
    """` (did you mean 'x'?)` for the choice closest to `word`, or nothing when none is close."""
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


# --- where a run runs: its device and its CPU threads ---

DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"
# A fixed count of CPU threads: more than any machine's cores, yet no core count of this one, so
# that a config (or a run to resume) is valid on every machine; OpenMP starts each thread it is
# given (a million failed in libgomp's allocator, after a long wait on 2 cores).
MAX_THREADS = 1024


def parse_threads(value: str | int) -> str | int:
    """`auto` or a positive integer (as given on the command line or in a config)."""
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    digits = text.lstrip("0")  # compared by length first: int() of 5,000 digits is refused
    if not re.fullmatch(r"[0-9]+", text) or not digits:
        raise ValueError(f"threads ({quote(value)}) must be auto or a positive integer")
    if len(digits) > len(str(MAX_THREADS)) or int(digits) > MAX_THREADS:
        raise ValueError(f"threads ({quote(value)}) must be at most {MAX_THREADS:,}: use auto, or "
                         f"a count up to this machine's cores")
    return int(digits)


def check_device(name: str, error=ConfigError) -> str:
    """`name` if it is auto, cpu, cuda or cuda:N, else `error` with one line."""
    if not isinstance(name, str) or not re.fullmatch(DEVICE_PATTERN, name):
        raise error(f"device ({quote(name)}) must be auto, cpu, cuda or cuda:N")
    return name
