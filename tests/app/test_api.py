"""The Python API: the same numbers, outputs and errors as the command line."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import types

import pytest
import torch

import minitfm
from minitfm import load_run, train
from minitfm.app.api import Run
from minitfm.config import load_config, parse_override
from minitfm.errors import ConfigError, MinitfmError, TaskInputError
from minitfm.run.instruments import Instrument
from tests.helpers import QUICK, TINY, run_cli

# QUICK as Python values, one key through the `__` spelling of its dots: 50 steps, a model that
# has learnt a little (no test here needs a solved one).
SETTINGS = dict(parse_override(item) for item in QUICK)
STEPS = SETTINGS["train.steps"]
SETTINGS["log__tensorboard"] = SETTINGS.pop("log.tensorboard", False)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    return train(None, run_dir=tmp_path_factory.mktemp("api") / "copy", progress=False,
                 **SETTINGS)


def test_import_minitfm_does_not_load_torch():
    code = "import sys, minitfm; print('torch' in sys.modules, minitfm.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "False"


def test_train_returns_the_loaded_run(run):
    assert isinstance(run, Run) and run.checkpoint.name == "best.pt"
    assert run.run_dir is not None and (run.run_dir / "checkpoints" / "last.pt").is_file()
    assert run.config.task.name == "copy" and run.config.log.tensorboard is False
    assert run.config == load_config(None, QUICK + ["log.tensorboard=false"])
    assert not any(run.run_dir.glob("events.*"))


def test_train_is_the_api_function_and_no_module_swaps_its_class():
    import minitfm.app.api as api
    import minitfm.run.session as session

    assert minitfm.train is train is api.train and callable(train)
    assert type(session) is types.ModuleType  # a plain module: no class swapped at import
    assert session.start_training.__module__ == "minitfm.run.session"  # what the CLI calls


@pytest.mark.parametrize("kwargs", [{"min_len": 5, "max_len": 9, "samples": 200},
                                    {"samples": 100, "seed": 3}])
def test_evaluate_equals_eval_json(run, kwargs):
    args = [f"--{key.replace('_', '-')}={value}" for key, value in kwargs.items()]
    result = run_cli("eval", run.checkpoint, *args, "--json")
    assert result.exit_code == 0, result.stderr
    assert run.evaluate(**kwargs) == json.loads(result.stdout)


def test_predict_equals_minitfm_predict(run):
    inputs = ["0 1 2 3", "4 3 2", "0123", "1"]
    result = run_cli("predict", run.checkpoint, *inputs)
    assert result.exit_code == 0, result.stderr
    assert run.predict(inputs) == result.stdout.splitlines()
    assert run.predict("0123") == result.stdout.splitlines()[2]
    assert run.predict([]) == []


def test_predict_errors_and_warnings_read_as_on_the_command_line(run):
    cli = run_cli("predict", run.checkpoint, "1 2", "1 x")
    with pytest.raises(TaskInputError) as err:
        run.predict(["1 2", "1 x"])
    assert f"error: {err.value}" == cli.stderr.strip()
    with pytest.warns(UserWarning, match=r"1 input is longer than the lengths trained on \(1..6"):
        run.predict("0 1 2 3 4 0 1")
    with pytest.raises(MinitfmError, match="samples"):
        run.evaluate(samples=0)


def test_attention_shapes_and_labels(run):
    maps = run.attention("0 1 2")
    assert maps.source == ["0", "1", "2"] and maps.decoder_input[0] == "<bos>"
    S, T = 3, len(maps.decoder_input)
    assert T == len(maps.prediction.split()) + 1  # <bos> + the output (its EOS row is last)
    for kind, shape in (("encoder", (2, S, S)), ("decoder", (2, T, T)), ("cross", (2, T, S))):
        layers = getattr(maps, kind)
        assert len(layers) == 1 and layers[0].shape == shape
        assert torch.allclose(layers[0].sum(-1), torch.ones(shape[:2]))
    assert maps.labels("cross") == (maps.decoder_input, maps.source)
    assert maps.labels("encoder") == (maps.source, maps.source)
    with pytest.raises(MinitfmError, match="kind"):
        maps.labels("all")
    assert run.attention().source  # the held-out probe of training


def test_load_run_picks_checkpoints_as_the_cli_does(run):
    last = load_run(run.run_dir, checkpoint="last")
    assert last.checkpoint.name == "last.pt" and last.step == STEPS
    cli = run_cli("eval", run.run_dir, "--checkpoint", "middle")
    with pytest.raises(MinitfmError) as err:
        load_run(run.run_dir, checkpoint="middle")
    assert f"error: {err.value}" == cli.stderr.strip()


def test_train_takes_a_dict_a_config_and_dotted_keys(tmp_path):
    quick = {key: v for key, v in SETTINGS.items() if not key.startswith("task.")}
    quick["train.steps"] = 5
    from_dict = train({"task": {"name": "reverse", "n_symbols": 5, "max_len": 6}},
                      run_dir=tmp_path / "dict", progress=False, **quick)
    assert from_dict.config.task.name == "reverse" and from_dict.config.train.steps == 5
    again = train(from_dict.config, run_dir=tmp_path / "config", progress=False,
                  train__steps=3)
    assert again.config.task == from_dict.config.task and again.config.train.steps == 3
    with pytest.raises(ConfigError, match="unknown config key 'train.stepz'"):
        train(None, train__stepz=3, progress=False)
    with pytest.raises(ConfigError, match="train.steps"):
        train(None, train__steps="many", progress=False)


# Each argument of the wrong type or out of the CLI's bounds: a MinitfmError naming it.
BAD_ARGUMENTS = {
    "predict_int": (lambda run: run.predict(123), "inputs (123)"),
    "predict_bytes": (lambda run: run.predict(b"1 2"), "inputs (b'1 2')"),
    "predict_list_int": (lambda run: run.predict([1, 2]), "input 1 (1)"),
    "predict_list_none": (lambda run: run.predict(["1", None]), "input 2 (None)"),
    "predict_none": (lambda run: run.predict(None), "inputs (None)"),
    "eval_float": (lambda run: run.evaluate(samples=2.5), "samples (2.5)"),
    "eval_str": (lambda run: run.evaluate(samples="10"), "samples ('10')"),
    "eval_bool": (lambda run: run.evaluate(samples=True), "samples (True)"),
    "eval_huge": (lambda run: run.evaluate(samples=100_001), "samples (100001)"),
    "eval_seed_big": (lambda run: run.evaluate(samples=5, seed=2**70), "seed (1180591"),
    "eval_max_len": (lambda run: run.evaluate(max_len=1.5), "max_len (1.5)"),
    "eval_batch": (lambda run: run.evaluate(batch_size=0), "batch_size (0)"),
    "attention_int": (lambda run: run.attention(123), "text (123)"),
    "train_list": (lambda run: train([1, 2]), "config ([1, 2])"),
    "train_run_dir": (lambda run: train(None, run_dir=5), "run_dir (5)"),
    "train_overwrite": (lambda run: train(None, overwrite="no"), "overwrite ('no')"),
    "train_resume": (lambda run: train(resume=3), "resume (3)"),
    "train_both": (lambda run: train("configs/copy.yaml", resume=run.run_dir),
                   "config ('configs/copy.yaml') cannot be combined with resume="),
    "load_int": (lambda run: load_run(123), "run (123)"),
    "load_checkpoint": (lambda run: load_run(run.run_dir, checkpoint=1), "checkpoint (1)"),
}


@pytest.mark.parametrize("call,start", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_arguments_are_checked(run, call, start):
    with pytest.raises(MinitfmError) as err:
        call(run)
    assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)


def test_errors_name_the_api_arguments_not_cli_options(run, tmp_path):
    with pytest.raises(MinitfmError) as err:
        train(None, run_dir=run.run_dir, progress=False, **SETTINGS)
    message = str(err.value)
    assert f"resume='{run.run_dir}'" in message and "overwrite=True" in message
    assert "--" not in message
    with pytest.raises(MinitfmError, match=r"^overwrite=True cannot be combined with resume="):
        train(resume=run.run_dir, overwrite=True, progress=False)
    with pytest.raises(TaskInputError) as err:
        run.attention(" ".join(["1"] * 500))
    assert str(err.value).startswith("text ('1 1 1") and "--input" not in str(err.value)


def test_train_resumes_and_overwrites_as_the_cli_does(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run.run_dir, copy)
    assert train(resume=copy, train__steps=STEPS + 3, progress=False).run_dir == copy.resolve()
    last = load_run(copy, checkpoint="last")
    assert last.step == STEPS + 3 and last.config.train.steps == STEPS + 3
    fresh = train(None, run_dir=copy, overwrite=True, progress=False,
                  **{**SETTINGS, "train.steps": 2})
    assert load_run(fresh.run_dir, checkpoint="last").step == 2


@pytest.mark.parametrize("heads_off, mode", [((), "zero"), ((("cross", 0, 1),), "zero"),
                                             ((("cross", 0, 0), ("encoder", 0, 1)), "mean")])
def test_an_answer_is_the_same_in_any_batch(run, heads_off, mode):
    """The same inputs, alone, in random orders and in batches of every size, with and without
    heads switched off, give the same answers (a batch's longest cap once leaked into them)."""
    texts = [" ".join(str((n + i) % 5) for i in range(1 + n % 6)) for n in range(24)]
    alone = [run.predict(text, heads_off=heads_off, mode=mode) for text in texts]
    generator = random.Random(0)
    for _ in range(3):
        order = list(range(len(texts)))
        generator.shuffle(order)
        size = generator.randint(2, len(texts))
        answers = {}
        for start in range(0, len(order), size):
            part = order[start:start + size]
            for i, answer in zip(part, run.predict([texts[i] for i in part],
                                                   heads_off=heads_off, mode=mode)):
                answers[i] = answer
        assert [answers[i] for i in range(len(texts))] == alone


# --- the API under threads, and its argument names (the fourth adversarial report) ---

TEXTS = ["1 2 3", "4 0 2 1", "3 3 1 0 2", "0 4"]
EVERY_HEAD = [(kind, 0, head) for kind in ("encoder", "decoder", "cross") for head in range(2)]


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_heads_off_in_one_thread_leave_a_plain_predict_in_another_alone(run, monkeypatch,
                                                                         mode):
    """AP_heads_off_zero, AP_heads_off_mean: thread B predicts while thread A's heads are
    switched off (for mean: while A records the heads' means) and gets the intact answers."""
    import threading
    from contextlib import contextmanager

    from minitfm.lab.interpret import ablate

    intact = run.predict(TEXTS)
    ablated = run.predict(TEXTS, heads_off=EVERY_HEAD, mode=mode)
    assert ablated != intact  # the case at hand: these heads matter
    answers: list = []
    attach = ablate.edited_heads

    def plain() -> None:
        try:
            answers.append(run.predict(TEXTS))
        except Exception as err:  # noqa: BLE001 - a crash is an answer here too
            answers.append(err)

    @contextmanager
    def midway(model, edits):
        with attach(model, edits):
            if edits and not answers:  # A's first edit is on: B predicts now, to the end
                answers.append("B ran")
                other = threading.Thread(target=plain)
                other.start()
                other.join()
            yield

    monkeypatch.setattr(ablate, "edited_heads", midway)
    assert run.predict(TEXTS, heads_off=EVERY_HEAD, mode=mode) == ablated
    assert answers == ["B ran", intact]


def test_two_threads_patching_at_once_get_each_its_own_answer(run, monkeypatch, tmp_path):
    """Thread B patches another pair from start to end while thread A's first patch of the
    residual stream is on: each gets the report it gets alone."""
    import threading
    from contextlib import contextmanager

    from minitfm.lab.interpret import patching

    alone = {text: run.patch(text, out=tmp_path / f"{i}.png").as_dict()
             for i, text in enumerate(("1 2 3 4", "2 3 4 1"))}
    answers: list = []
    attach, calls = patching.residual_edits, []

    def other() -> None:
        try:
            answers.append(run.patch("2 3 4 1", out=tmp_path / "b.png").as_dict())
        except Exception as err:  # noqa: BLE001 - a crash is an answer here too
            answers.append(err)

    @contextmanager
    def midway(model, edits):
        with attach(model, edits):
            calls.append(threading.get_ident())
            if len(calls) == 2:  # A recorded its clean run and patches its first position
                answers.append("B ran")
                thread = threading.Thread(target=other)
                thread.start()
                thread.join()
            yield

    monkeypatch.setattr(patching, "residual_edits", midway)
    assert run.patch("1 2 3 4", out=tmp_path / "a.png").as_dict() == alone["1 2 3 4"]
    assert answers == ["B ran", alone["2 3 4 1"]]


def test_the_logit_lens_in_one_thread_is_not_fed_by_another(run, monkeypatch):
    """Thread B decodes while thread A's logit lens has its hooks on the decoder layers: A
    reads its own input's layers only."""
    import threading
    from contextlib import contextmanager

    from minitfm.lab.interpret import lens

    src = run.task.parse("1 2 3 4")
    alone = lens.logit_lens(run.model, run.task, src)
    plain = lens.eval_mode

    @contextmanager
    def midway(model):
        with plain(model):
            thread = threading.Thread(target=lambda: run.predict(["4 3 2 1 0"]))
            thread.start()
            thread.join()
            yield model

    monkeypatch.setattr(lens, "eval_mode", midway)
    assert lens.logit_lens(run.model, run.task, src) == alone


class Pause(Instrument):
    """An instrument that, after step `at`, calls `then()` once."""

    def __init__(self, at: int, then):
        self.at, self.then = at, then

    def on_step(self, stepped) -> None:
        if stepped.step == self.at:
            self.then()


def test_two_trainings_at_once_give_each_ones_numbers_alone(tmp_path, monkeypatch):
    """AP_train_threads_dropout: run 1 starts while run 0 is at step 3, and run 0 goes on once
    run 1 has stepped (or waits its turn): dropout draws no number of the other's."""
    import threading

    from minitfm.app.api import train_run
    from minitfm.run import session

    def config(seed: int):
        return load_config(None, [*TINY, "model.dropout=0.1", "train.steps=30",
                                  "train.eval_every=10", "train.eval_samples=50",
                                  "log.tensorboard=false", "threads=1", f"seed={seed}"])

    def losses(run_dir) -> list:
        return [(r["step"], r["split"], r["loss"]) for r in
                map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]

    alone = {}
    for seed in (0, 1):
        train_run(config(seed), run_dir=tmp_path / f"alone{seed}")
        alone[seed] = losses(tmp_path / f"alone{seed}")

    lock = WatchedLock()
    monkeypatch.setattr(session, "TRAINING_LOCK", lock, raising=False)
    stepped, failures = threading.Event(), []

    def second() -> None:
        try:
            train_run(config(1), Pause(1, stepped.set), run_dir=tmp_path / "together1")
        except Exception as err:  # noqa: BLE001
            failures.append(err)

    other = threading.Thread(target=second)

    def start_the_other() -> None:
        other.start()
        while not (stepped.is_set() or lock.waiting.is_set()) and other.is_alive():
            stepped.wait(0.01)

    train_run(config(0), Pause(3, start_the_other), run_dir=tmp_path / "together0")
    other.join()
    assert failures == []
    assert losses(tmp_path / "together0") == alone[0]
    assert losses(tmp_path / "together1") == alone[1]


def test_heads_off_none_means_no_heads_and_mode_errors_name_the_argument(run):
    """AP_heads_off_args: heads_off=None, mode='foo' and mode=None."""
    assert run.predict(TEXTS, heads_off=None) == run.predict(TEXTS)
    for mode in ("foo", None):
        with pytest.raises(MinitfmError) as err:
            run.predict("1 2", heads_off=[("cross", 0, 0)], mode=mode)
        assert str(err.value).startswith(f"mode ({mode!r}) must be one of zero, mean"), \
            str(err.value)
        assert "--" not in str(err.value)


def dropout_config(seed: int, steps: int = 30):
    """TINY with dropout on, a loss line every 10 steps, no TensorBoard: a notebook's run."""
    return load_config(None, [*TINY, "model.dropout=0.1", f"train.steps={steps}",
                              "train.eval_every=10", "train.eval_samples=50",
                              "log.tensorboard=false", "threads=1", f"seed={seed}"])


def logged_losses(run_dir) -> list:
    return [(r["step"], r["split"], r["loss"]) for r in
            map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def test_loading_a_run_leaves_the_callers_random_numbers_as_they_were(run):
    """Building a model to load weights into draws its initial values from torch's global RNG:
    a load gives the stream back as it found it, so a seeded notebook draws the same numbers
    with or without a load_run in between."""
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    load_run(run.run_dir)
    assert torch.equal(torch.rand(4), expected)


def test_a_run_loaded_while_another_trains_draws_none_of_its_numbers(run, tmp_path,
                                                                     monkeypatch):
    """At step 3 of a run with dropout another thread loads a run: the load waits for the
    training (or draws aside), and the training's losses are those of the run alone."""
    import threading

    from minitfm.app.api import train_run
    from minitfm.run import session

    train_run(dropout_config(0), run_dir=tmp_path / "alone")
    lock = WatchedLock()
    monkeypatch.setattr(session, "TRAINING_LOCK", lock)
    loads = []

    def load_meanwhile() -> None:
        loader = threading.Thread(target=lambda: loads.append(load_run(run.run_dir)))
        loader.start()
        while loader.is_alive() and not lock.waiting.is_set():
            loader.join(0.01)

    train_run(dropout_config(0), Pause(3, load_meanwhile), run_dir=tmp_path / "together")
    while len(loads) < 1:  # the load went on once the training had ended
        threading.Event().wait(0.01)
    assert logged_losses(tmp_path / "together") == logged_losses(tmp_path / "alone")


class WatchedLock:
    """The training lock (re-entrant), saying when a thread waits for it."""

    def __init__(self):
        import threading

        self.lock, self.waiting = threading.RLock(), threading.Event()

    def __enter__(self):
        if not self.lock.acquire(blocking=False):
            self.waiting.set()
            self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def two_trainings_at_once(tmp_path, trials: int) -> list[str]:
    """`minitfm.train` of seeds 0 and 1 started together in two threads, `trials` times, as a
    notebook would; which runs differ from the same run alone."""
    import threading

    settings = {**SETTINGS, "model__dropout": 0.1, "train__steps": 30, "threads": 1}
    alone = {}
    for seed in (0, 1):
        train(None, run_dir=tmp_path / f"alone{seed}", progress=False, seed=seed, **settings)
        alone[seed] = logged_losses(tmp_path / f"alone{seed}")
    differ, start = [], threading.Barrier(2)

    def one(trial: int, seed: int) -> None:
        start.wait()
        train(None, run_dir=tmp_path / f"t{trial}-{seed}", progress=False, seed=seed, **settings)

    for trial in range(trials):
        threads = [threading.Thread(target=one, args=(trial, seed)) for seed in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        differ += [f"trial {trial} seed {seed}" for seed in (0, 1)
                   if logged_losses(tmp_path / f"t{trial}-{seed}") != alone[seed]]
    return differ


def test_two_train_calls_at_once_each_equal_the_run_alone(tmp_path):
    """Threads: two `minitfm.train` calls started together, dropout on, 3 times: each run's
    logged losses are its losses alone (the slow suite tries 10 times)."""
    assert two_trainings_at_once(tmp_path, 3) == []


@pytest.mark.slow
def test_two_train_calls_at_once_equal_the_run_alone_in_ten_trials(tmp_path):
    assert two_trainings_at_once(tmp_path, 10) == []

