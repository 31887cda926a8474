"""The Python API: load a trained run, decode with it, look at its attention, evaluate, train.

    >>> from minitfm import load_run, train
    >>> run = load_run("runs/reverse-20261121-101500", checkpoint="best")
    >>> run.predict(["3 1 4"])
    ['4 1 3']
    >>> maps = run.attention("3 1 4")
    >>> maps.cross[0].shape  # layer 0: (heads, query: <bos> 4 1 3, key: 3 1 4)
    torch.Size([4, 4, 3])
    >>> report = run.evaluate(min_len=17, max_len=32)  # the dict `minitfm eval --json` prints
    >>> run = train("configs/copy.yaml", train__steps=50)  # `train.steps=50`: __ for a dot

Each call goes through the functions the command line uses, so it gives the same numbers:
`load_run` reads a RUN argument and `--checkpoint`, `Run.predict` is `minitfm predict`,
`Run.evaluate` is `minitfm eval --json`, `Run.attention` holds the maps `minitfm
visualize-attention` draws, and `train` is `minitfm train`. Mistakes raise
`minitfm.errors.MinitfmError` (a subclass) with the one-line message the CLI prints, an option
named as this API's argument (`max_len`, not `--max-len`).

Threads: a `Run` may be shared by threads (`predict` with heads switched off, `patch` and
`explain` hook the model for their own thread's passes only); `train` calls run one at a time
in a process, each as it would alone (torch's random numbers and thread count are the
process's).

Shapes: H n_heads, S source length, T decoder input length (<bos> + the output; the query at
row t writes output token t, and the last row writes EOS).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from minitfm.config import Config, load_config
from minitfm.errors import MinitfmError, quote, spell
from minitfm.lab.attention.probe import KINDS, map_blocks, run_probe
from minitfm.lab.attention.visualize import read_input
from minitfm.lab.loaded import Loaded, load
from minitfm.lab.measure.evaluate import eval_report, predict_lines
from minitfm.lab.options import EvalOptions, ExplainOptions, PatchOptions, bounded
from minitfm.run.instruments import Instrument
from minitfm.run.which_run import resolve_checkpoint

# How messages name `train`'s options here (see `errors.option`): as this API's arguments.
API_OPTIONS = {"resume": "resume=", "resume_of": "resume='{}'", "run_dir": "run_dir=",
               "overwrite": "overwrite=True", "again": "train(resume='{}')",
               "book": "book='{}'", "mode": "mode", "samples": "samples",
               "min_len": "min_len", "max_len": "max_len"}


@dataclass
class Attention:
    """The attention maps of one input: per layer a tensor (heads, query, key) of weights
    (each row sums to 1), and the tokens that label the query and key axes."""

    source: list[str]  # encoder tokens: queries and keys of `encoder`, keys of `cross`
    decoder_input: list[str]  # <bos> + the output: queries of `decoder` and `cross`
    prediction: str  # the greedy output, as `predict` writes it for spaced input
    encoder: list[Tensor] = field(repr=False)  # per layer (H, S, S)
    decoder: list[Tensor] = field(repr=False)  # per layer (H, T, T)
    cross: list[Tensor] = field(repr=False)  # per layer (H, T, S)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(query tokens, key tokens) of the maps of `kind`: encoder, decoder or cross.

        >>> queries, keys = maps.labels("cross")  # (['<bos>', '4', '1', '3'], ['3', '1', '4'])
        """
        if kind not in KINDS:
            raise MinitfmError(f"kind ({kind!r}) must be one of {', '.join(KINDS)}")
        queries = self.source if kind == "encoder" else self.decoder_input
        return queries, self.decoder_input if kind == "decoder" else self.source


class Run(Loaded):
    """A trained model loaded from a checkpoint, in eval mode, with its config and task: the
    lab's `Loaded` (attributes `checkpoint`, `step`, `run_dir`, `config`, `task`, `model`,
    `device`) with the command line's calls."""

    def predict(self, inputs: str | Sequence[str], heads_off: Sequence | None = (),
                mode: str = "zero") -> str | list[str]:
        """Greedy-decode inputs in task syntax; one string in, one out; a list in, a list out.

        Outputs are written as the inputs are (`"314"` -> `"413"`, `"12+34"` -> `"46"`). An
        input longer than the trained lengths gives a UserWarning, a bad input a MinitfmError.
        `heads_off` switches attention heads off, as `minitfm ablate` does: (kind, layer, head)
        triples, kind "encoder", "decoder" or "cross" (None or empty: none); `mode` "zero" or
        "mean" (the mean over the held-out set `minitfm ablate` decodes). They are off for this
        call's decoding only: another thread's calls meanwhile see every head on.

        >>> run.predict(["3 1 4", "2 7"])
        ['4 1 3', '7 2']
        >>> run.predict("3 1 4", heads_off=[("cross", 1, 2)], mode="mean")
        """
        from minitfm.lab.interpret.ablate import edited_heads, switched_off

        texts = input_texts(inputs)
        with api_spelling(), self.running(), edited_heads(self.model,
                                                          switched_off(self, heads_off, mode)):
            result = predict_lines(self, list(enumerate(texts, 1)))
        if result.error is not None:
            raise result.error
        if result.warning:
            warnings.warn(result.warning, stacklevel=2)
        outputs = [row["output"] for row in result.rows]
        return outputs[0] if isinstance(inputs, str) else outputs

    def attention(self, text: str | None = None) -> Attention:
        """The maps of one input (default: the held-out example TensorBoard shows).

        >>> maps = run.attention("3 1 4")
        >>> maps.encoder[0].shape, maps.decoder[0].shape  # (H, S, S), (H, T, T)
        (torch.Size([4, 3, 3]), torch.Size([4, 4, 4]))
        """
        check_type("text", text, (str, type(None)), "a string in task syntax, or None")
        held_out = self.held_out() if text is None else []
        with self.running():
            probe = run_probe(self.model, self.task, read_input(self, text, held_out, "text"))
        blocks = {block.kind: block for block in map_blocks(probe, self.task)}
        maps = probe.maps
        return Attention(blocks["encoder"].keys, blocks["decoder"].keys,
                         self.task.format(probe.prediction), maps.encoder, maps.decoder,
                         maps.cross)

    def evaluate(self, samples: int = EvalOptions.samples, min_len: int | None = None,
                 max_len: int | None = None, seed: int | None = None,
                 batch_size: int = EvalOptions.batch_size) -> dict:
        """The dict `minitfm eval --json` prints: exact match, token accuracy, loss, per length.

        >>> report = run.evaluate(min_len=17, max_len=32)  # beyond the trained lengths
        >>> report["exact_match"], report["per_length"]["17"]["exact_match"]
        """
        options = EvalOptions(samples=samples, min_len=min_len, max_len=max_len, seed=seed,
                              batch_size=batch_size)
        for name, value, low, high in bounded(options):  # the bounds of `minitfm eval`
            check_integer(name, value, low, high)
        with api_spelling(), self.running():
            return eval_report(self, options)

    def explain(self, samples: int = ExplainOptions.samples,
                out: str | Path | None = None, force: bool = False):
        """`minitfm explain`: a role card for every head (its pattern, its drops with 95%
        intervals, its patching share, its role), the logit lens of one held-out input, and
        the PNG of the cards; `.as_dict()` is what `--json` prints.

        >>> report = run.explain()
        >>> [card.role for card in report.cards if card.effect == "essential"]
        """
        from minitfm.lab.interpret.explain import explain

        options = ExplainOptions(samples=samples, out=None if out is None else Path(out),
                                 force=force)
        for name, value, low, high in bounded(options):  # the bounds of `minitfm explain`
            check_integer(name, value, low, high)
        with self.running():
            return explain(self, options)

    def patch(self, clean: str | None = None, corrupt: str | None = None,
              out: str | Path | None = None, force: bool = False):
        """`minitfm patch`: the restored share of every head and of the residual stream at
        every position, patched from `clean`'s run into `corrupt`'s (defaults: the held-out
        example, and its first one-token change that changes the answer); writes the PNG.

        >>> report = run.patch("3 1 4 1 5", "9 1 4 1 5")
        >>> [(row["kind"], row["layer"], row["head"]) for row in report.heads
        ...  if row["restored"] > 0.2]
        """
        from minitfm.lab.interpret.patching import patch

        for name, value in (("clean", clean), ("corrupt", corrupt)):
            check_type(name, value, (str, type(None)), "a string in task syntax, or None")
        with self.running():
            report = patch(self, PatchOptions(clean=clean, corrupt=corrupt, force=force,
                                              out=None if out is None else Path(out)))
        if report.warning:
            warnings.warn(report.warning, stacklevel=2)
        return report


def load_run(run: str | Path | None = None, checkpoint: str = "best",
             book: str | Path | None = None) -> Run:
    """Load a run directory or a .pt file (None: the most recent run under ./runs).

    `checkpoint` is "best" (highest exact match; last.pt, with a UserWarning, while the run
    has none) or "last", as `--checkpoint` on the command line; `book`, a workbook of
    `minitfm learn` whose code the model runs, as `--book` (a run trained with a workbook runs
    the book's code unless asked, with a UserWarning saying so).

    >>> run = load_run("runs/copy-20261121-101500", checkpoint="last")
    """
    check_type("run", run, (str, Path, type(None)), "a run directory or .pt file, or None")
    check_type("checkpoint", checkpoint, str, '"best" or "last"')
    check_type("book", book, (str, Path, type(None)), "a workbook folder, or None")
    try:
        loaded = load(run, checkpoint, book=book)
    except MinitfmError as err:
        for note in getattr(err, "__notes__", ()):  # best.pt fell back to last.pt, then failed
            warnings.warn(note, stacklevel=2)
        raise
    for note in (loaded.note, loaded.code_note):
        if note:
            warnings.warn(spell(note, API_OPTIONS), stacklevel=2)
    return Run(**vars(loaded))


def train(config: str | Path | dict | Config | None = None, /, *,
          run_dir: str | Path | None = None, resume: str | Path | None = None,
          overwrite: bool = False, progress: bool = True, book: str | Path | None = None,
          **overrides: Any) -> Run:
    """Train as `minitfm train CONFIG KEY=VALUE...` does; the new run, loaded (best checkpoint).

    `config` is a YAML file, a dict of the same sections, a Config, or None for the built-in
    default (configs/reverse.yaml). Each override is a keyword argument named by the config
    key with `__` for each dot, its value a Python value: `train__steps=50` is
    `train.steps=50`, `model__positional="rope"`, `seed=1`; `**{"train.steps": 50}` works
    too. `run_dir` is `--run-dir`, `resume` (a run or its checkpoint, with no `config`)
    `--resume`, `overwrite=True` `--overwrite`, `book` `--book` (train with a workbook's
    code, see `start_workbook`); `progress=False` trains silently.

    >>> run = train("configs/copy.yaml", train__steps=50, model__n_heads=2)
    >>> run = train({"task": {"name": "sort"}}, **{"train.steps": 50}, progress=False)
    >>> run = train(resume=run.run_dir, train__steps=100)  # the same run, 50 steps more
    """
    from minitfm.app.progress import ConsoleReporter
    from minitfm.run.memory import keep_freed_memory

    check_train_arguments(config, run_dir, resume, overwrite, progress)
    pairs = [(key.replace("__", "."), value) for key, value in overrides.items()]
    check_type("book", book, (str, Path, type(None)), "a workbook folder, or None")
    if book is not None:
        pairs.append(("model.code", str(Path(book).resolve())))
    options: dict[str, Any] = {"run_dir": None if run_dir is None else Path(run_dir),
                               "overwrite": overwrite}
    if resume is not None:  # the config comes from the checkpoint, as on the command line
        cfg = None
        options.update(resume=resolve_checkpoint(resume, "last"), overrides=pairs)
    else:
        with api_spelling():  # a config file naming a workbook: the error names book=
            cfg = load_config(config.model_dump() if isinstance(config, Config) else config,
                              pairs)
    keep_freed_memory()  # as the CLI does: fewer page faults, faster steps
    reporter = ConsoleReporter() if progress else None
    try:
        with api_spelling():
            summary = train_run(cfg, reporter, **options)
    finally:
        if reporter is not None:
            reporter.stop()
    return load_run(summary["run_dir"], book=book)  # the workbook asked for, if any


@contextmanager
def api_spelling() -> Iterator[None]:
    """The block's MinitfmError with the options its message names spelled as this API's
    arguments (`errors.option`)."""
    try:
        yield
    except MinitfmError as err:
        err.spelled(API_OPTIONS)
        raise


def check_train_arguments(config: Any, run_dir: Any, resume: Any, overwrite: Any,
                          progress: Any) -> None:
    """`train`'s arguments of the right types; `config` and `resume` not both."""
    check_type("config", config, (str, Path, dict, Config, type(None)),
               "a YAML file (str or Path), a dict of sections, a Config, or None")
    check_type("run_dir", run_dir, (str, Path, type(None)), "a folder (str or Path), or None")
    check_type("resume", resume, (str, Path, type(None)),
               "a run directory or .pt file (str or Path), or None")
    check_type("overwrite", overwrite, bool, "True or False")
    check_type("progress", progress, bool, "True or False")
    if resume is not None and config is not None:
        raise MinitfmError(f"config ({quote(config)}) cannot be combined with resume=: a "
                           f"resumed run's config comes from its checkpoint; give only "
                           f"keyword overrides such as train__steps=500")


def check_type(name: str, value: Any, types: type | tuple[type, ...], what: str) -> None:
    """A MinitfmError naming the argument unless `value` is one of `types`."""
    if not isinstance(value, types):
        raise MinitfmError(f"{name} ({quote(value)}) must be {what}, not "
                           f"{type(value).__name__}")


def check_integer(name: str, value: Any, low: int, high: int) -> None:
    """An int (not a bool) within `low`..`high`, or a MinitfmError naming the argument."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise MinitfmError(f"{name} ({quote(value)}) must be an integer from {low:,} to "
                           f"{high:,}")


def input_texts(inputs: Any) -> list[str]:
    """`predict`'s inputs as a list of strings: one string, or an iterable of strings."""
    if isinstance(inputs, str):
        return [inputs]
    if not isinstance(inputs, Iterable) or isinstance(inputs, (bytes, bytearray, dict)):
        raise MinitfmError(f"inputs ({quote(inputs)}) must be a string or a list of strings in "
                           f"task syntax, e.g. ['3 1 4'], not {type(inputs).__name__}")
    texts = list(inputs)
    for number, text in enumerate(texts, 1):
        check_type(f"input {number}", text, str, "a string in task syntax, e.g. '3 1 4'")
    return texts


def instruments(reporter: Instrument | None = None,
                warn: Callable[[str], None] | None = None) -> list[Instrument]:
    """What watches a run of `minitfm train`, besides the metrics.jsonl it writes itself: the
    attention recorder (attention.jsonl), the gauge reader (its readings in metrics.jsonl),
    TensorBoard (drawing the recorder's snapshots, plotting the readings), MLflow (with
    log.mlflow) and `reporter`, the console's progress, if any. MLflow's failure is a warning
    line through `warn`, else `reporter`, else a UserWarning. A new instrument is one line here."""
    from minitfm.lab.attention.probe import LatestPass
    from minitfm.lab.attention.timeline import AttentionRecorder
    from minitfm.lab.watch.gauges import GaugeReader
    from minitfm.lab.watch.tb import TensorBoardLogger
    from minitfm.lab.watch.tracker import MlflowTracker
    from minitfm.run.instruments import Note

    if warn is None and reporter is not None:
        def warn(text: str) -> None:
            reporter.on_note(Note(text, warning=True))

    passes = LatestPass()  # the recorder and the reader share a step's pass over their pairs
    attention = AttentionRecorder(passes=passes)
    return [attention, GaugeReader(passes), TensorBoardLogger(attention),
            MlflowTracker(attention, warn), *([reporter] if reporter else [])]


def train_run(cfg: Config | None, reporter: Instrument | None = None,
              **options: Any) -> dict[str, Any]:
    """One run as `minitfm train` makes it, its `instruments` attached; `options` are the
    fields of `run.session.RunOptions`; the summary."""
    from minitfm.run.session import RunOptions, start_training

    return start_training(cfg, RunOptions(**options), instruments(reporter))


# --- minitfm learn ---

def start_workbook(folder: str | Path = "workbook") -> Path:
    """Write a workbook, as `minitfm learn start DIR`: the book's chapters with the exercises'
    bodies left to write (a folder that exists is never written over); its path."""
    from minitfm.learn.exercises import workbook_readme
    from minitfm.learn.workbook import write_workbook

    check_type("folder", folder, (str, Path), "a folder (str or Path)")
    write_workbook(Path(folder), workbook_readme(str(folder)))
    return Path(folder)


def check_workbook(folder: str | Path = "workbook",
                   exercises: str | Sequence[str] | None = None) -> list[dict]:
    """Grade a workbook, as `minitfm learn check DIR --json`: a dict per exercise (exercise,
    file, function, status: passed / failed / not started, check, message, hint); `exercises`
    one name or several, all when None."""
    from minitfm.learn.grading import grade_workbook
    from minitfm.learn.workbook import load_workbook
    from minitfm.run.session import drawing_aside

    check_type("folder", folder, (str, Path), "a folder (str or Path)")
    if isinstance(exercises, str):  # one name, not its letters
        exercises = [exercises]
    names = None if exercises is None else list(exercises)
    with drawing_aside():  # the checks seed torch's RNG: nobody's numbers change
        return [grade.as_dict() for grade in grade_workbook(load_workbook(folder), names)]


@dataclass(frozen=True)
class Checked:
    """One function graded as an exercise: `passed`, and if not, the check, what and a hint."""

    exercise: str
    status: str  # "passed", "failed" or "not started"
    check: str = ""
    message: str = ""
    hint: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __bool__(self) -> bool:
        """`assert check(...)` holds only when it passed."""
        return self.passed

    def __str__(self) -> str:
        if self.status != "failed":
            return f"{self.exercise}: {self.status}"
        hint = f"\n  hint: {self.hint}" if self.hint else ""
        return f"{self.exercise}: failed: {self.check}\n  {self.message}{hint}"


def check(exercise: str, function: Any) -> Checked:
    """Grade a function written anywhere (a notebook cell) as the book's `exercise`, with the
    checks of `minitfm learn check`; a method takes `self` first.

    >>> def attention(q, k, v, mask=None, bias=None, dropout=None): ...
    >>> print(check("attention", attention))  # passed, or the first failing check and a hint
    """
    from minitfm.learn.grading import check_function
    from minitfm.run.session import drawing_aside

    check_type("exercise", exercise, str, "an exercise's name, such as 'attention'")
    if not callable(function):
        raise MinitfmError(f"function ({quote(function)}) is not callable: pass the function "
                           f"you wrote, such as check('attention', attention)")
    with drawing_aside():  # the checks seed torch's RNG: nobody's numbers change
        grade = check_function(exercise, function)
    return Checked(exercise, grade.status, grade.check, grade.message, grade.hint)
