"""`minitfm eval` and `minitfm predict`: honest metrics, per-length tables, text I/O."""

import json

import pytest

from minitfm.book.metrics import predict
from minitfm.config import load_config
from minitfm.lab.loaded import load
from minitfm.tasks import make_task
from tests.helpers import QUICK, TINY, assert_clean_error, run_cli
from tests.helpers import train_bare as train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A quick copy run (50 steps, exact match ~0.3) for eval and predict to read."""
    run_dir = tmp_path_factory.mktemp("runs") / "copy"
    train(load_config(None, [*QUICK, "log.tensorboard=false"]), run_dir=run_dir)
    return run_dir


def test_eval_json_schema(run):
    result = run_cli("eval", run, "--json", "--samples", "300")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"exact_match", "token_accuracy", "loss", "samples", "checkpoint", "step",
            "per_length"} <= set(report)
    assert report["samples"] == 300 and report["checkpoint"].endswith("best.pt")
    assert sum(row["count"] for row in report["per_length"].values()) == 300
    assert set(report["per_length"]) <= {str(n) for n in range(1, 7)}
    for row in report["per_length"].values():
        assert set(row) == {"count", "exact_match", "token_accuracy"}


def test_eval_beyond_trained_lengths_is_marked(run):
    result = run_cli("eval", run, "--min-len", "5", "--max-len", "9", "--samples", "200")
    assert result.exit_code == 0, result.stderr
    assert "9 *" in result.stdout and "outside the trained range" in result.stdout
    report = json.loads(run_cli("eval", run, "--min-len", "7", "--max-len", "9", "--json",
                                "--samples", "200").stdout)
    assert set(report["per_length"]) == {"7", "8", "9"}


@pytest.mark.slow
def test_predict_keeps_input_order_across_length_chunks(tmp_path):
    # A trained model (200 steps, exact match ~0.95) ends every row with EOS; a row that never
    # does is cut at its chunk's longest cap, so alone and batched it could differ in length.
    train(load_config(None, [*TINY, "log.tensorboard=false"]), run_dir=tmp_path / "run")
    loaded = load(tmp_path / "run" / "checkpoints" / "best.pt", device="cpu")
    task, model = loaded.task, loaded.model
    sources = [[1, 2, 3, 4, 0, 1], [4], [2, 2, 3], [0, 1], [3, 3, 3, 3], [1]]
    alone = [predict(model, task, [src], "cpu")[0] for src in sources]
    assert predict(model, task, sources, "cpu", batch_size=2) == alone


def test_eval_and_predict_agree(run):
    task = make_task(load_config(None, TINY).task)
    report = json.loads(run_cli("eval", run, "--json", "--samples", "50", "--seed", "7").stdout)
    from minitfm.tasks.base import eval_set
    pairs = eval_set(task, 50, 7)
    lines = "\n".join(task.format(src) for src, _ in pairs) + "\n"
    result = run_cli("predict", run, "--json", input=lines)
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 50
    assert sum(r["match"] for r in rows) / 50 == pytest.approx(report["exact_match"])
    for row, (_, tgt) in zip(rows, pairs):
        assert row["expected"] == task.format(tgt)


def test_predict_arguments_and_stdin_give_the_same_lines(run):
    args = run_cli("predict", run, "0 1 2 3", "4 3 2")
    stdin = run_cli("predict", run, input="0 1 2 3\n4 3 2\n")
    assert args.exit_code == stdin.exit_code == 0
    assert args.stdout == stdin.stdout and len(args.stdout.splitlines()) == 2


def test_predict_bad_inputs(run):
    assert_clean_error(run_cli("predict", run, "1 9"), 2, "'9'")
    assert_clean_error(run_cli("predict", run, input=""), 2, "no input")
    assert_clean_error(run_cli("predict", run, input="\n  \n"), 2, "no input")
    assert_clean_error(run_cli("predict", run, "1 <eos>"), 2, "<eos>")
    assert_clean_error(run_cli("predict", run, "10 11"), 2, "'10' is not a symbol")


def test_predict_skips_blank_stdin_lines(run):
    result = run_cli("predict", run, input="1 2\n\n   \n3 4\n")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == run_cli("predict", run, "1 2", "3 4").stdout
    assert len(result.stdout.splitlines()) == 2


def test_predict_prints_the_lines_before_a_bad_one(run):
    result = run_cli("predict", run, "--json", input="1 2\n\n3 4\n1 x\n2 2\n")
    assert_clean_error(result, 2, "line 4 ('1 x')", "'x' is not a symbol")
    assert [json.loads(line)["input"] for line in result.stdout.splitlines()] == ["1 2", "3 4"]
    first = run_cli("predict", run, "1 x", "2 2")
    assert_clean_error(first, 2, "input 1 ('1 x')")
    assert first.stdout == ""


def test_predict_warns_once_about_inputs_longer_than_trained(run):
    inside = run_cli("predict", run, "0 1 2 3 4 0")  # task.max_len 6
    assert inside.exit_code == 0 and inside.stderr == ""
    result = run_cli("predict", run, "0 1 2 3 4 0 1", "1 2", "0 1 2 3 4 0 1 2 3")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    warning = result.stderr.strip()
    assert warning.startswith("warning: 2 inputs are longer than") and "\n" not in warning
    assert "1..6" in warning and "the longest has 9" in warning


def test_predict_writes_outputs_as_the_inputs_are_written(run):
    rows = [json.loads(line) for line in
            run_cli("predict", run, "--json", "0123", "0 1 2 3").stdout.splitlines()]
    assert [row["expected"] for row in rows] == ["0123", "0 1 2 3"]
    assert " " not in rows[0]["output"] and rows[1]["output"].count(" ") >= 1


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Untrained-ish runs (5 steps) of add and of copy with two-digit symbols."""
    folder = tmp_path_factory.mktemp("runs")
    for name, task in (("add", ["task.name=add", "task.n_symbols=10", "task.max_len=3"]),
                       ("wide", ["task.n_symbols=12"])):
        cfg = load_config(None, [*TINY, *task, "train.steps=5", "log.tensorboard=false"])
        train(cfg, run_dir=folder / name)
    return folder


def test_predict_add_prints_numbers_as_written(tiny_runs):
    result = run_cli("predict", tiny_runs / "add", "--json", "12+34", "1 2 + 3 4", "99 + 1")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["expected"] for row in rows] == ["46", "4 6", "100"]
    assert " " not in rows[0]["output"] + rows[2]["output"]


def test_predict_reads_multi_character_symbols_whole(tiny_runs):
    result = run_cli("predict", tiny_runs / "wide", "--json", "10 11 3")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["expected"] == "10 11 3"
    assert_clean_error(run_cli("predict", tiny_runs / "wide", "1 12"), 2, "'12' is not a symbol")


def test_eval_bad_arguments(run):
    assert_clean_error(run_cli("eval", run, "--min-len", "9", "--max-len", "3"), 2, "--min-len")
    assert_clean_error(run_cli("eval", run, "--checkpoint", "middle"), 2, "--checkpoint")
    assert_clean_error(run_cli("eval", run / "nope"), 2, "not found")


def test_learned_positions_say_when_a_length_is_out_of_reach(tmp_path):
    run_dir = tmp_path / "learned"
    cfg = load_config(None, [*TINY, "model.positional=learned", "model.max_len=8",
                             "train.steps=10", "log.tensorboard=false"])
    train(cfg, run_dir=run_dir)
    result = run_cli("eval", run_dir, "--max-len", "20")
    assert_clean_error(result, 2, "model.max_len (8)")
    assert_clean_error(run_cli("predict", run_dir, "1 2 3 4 1 2 3 4 1 2"), 2, "input 1")
