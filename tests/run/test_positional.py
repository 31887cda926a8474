"""Positional settings in configs and runs: refused in one line, the length generalisation
configs, training, evaluating and resuming with them (the schemes in the model:
tests/book/test_positional.py)."""

import json
import re
from pathlib import Path

import pytest

from minitfm.book.positions import RotaryPositions
from minitfm.catalog import POSITIONALS, position_shortfall
from minitfm.config import load_config
from minitfm.errors import ConfigError
from minitfm.tasks import make_task
from tests.helpers import TINY, assert_clean_error, run_cli
from tests.helpers import train_bare as train

# RoPE's head width


def test_rope_needs_an_even_head_width():
    result = run_cli("train", "model.positional=rope", "model.d_model=12", "model.n_heads=4")
    assert_clean_error(result, 2, "model.positional rope turns pairs of features",
                       "model.d_model / model.n_heads (3) must be even")
    with pytest.raises(AssertionError, match=r"d_head \(5\) must be even"):
        RotaryPositions(5)


# Config


BAD = [
    (["model.random_positions=64", "model.positional=none"], "model.random_positions (64) needs"),
    (["model.random_positions=300", "model.positional=learned"], "model.max_len (256)"),
    (["model.random_positions=16"], "model.random_positions (16) must exceed task.max_len (16)"),
    (["model.random_positions=1"], "model.random_positions"),
    (["model.positional=rotary"], "did you mean 'rope'"),
]


@pytest.mark.parametrize("overrides, message", BAD)
def test_bad_positional_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_positional_settings_load():
    assert tuple(POSITIONALS) == ("sinusoidal", "learned", "rope", "alibi", "none")
    cfg = load_config(None, ["model.positional=alibi", "model.random_positions=64"])
    assert (cfg.model.positional, cfg.model.random_positions) == ("alibi", 64)
    assert load_config().model.random_positions is None


ROOT = Path(__file__).resolve().parents[2]


def readme_settings() -> list[list[str]]:
    """The overrides of each row of docs/experiments.md's length generalisation tables."""
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    section = text.split("## Length generalisation")[1].split("\n## ")[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| ")]
    settings = [" ".join(re.findall(r"`([^`]*=[^`]*)`", cell)).split() for cell in rows]
    return [s for s, cell in zip(settings, rows) if s or cell.strip().startswith("(none")]


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_lengthgen_configs_take_every_setting_of_the_readme(task):
    settings = readme_settings()
    assert len(settings) >= 10 and [] in settings
    for overrides in settings:
        cfg = load_config(ROOT / "configs" / f"lengthgen-{task}.yaml", overrides)
        assert (cfg.task.name, cfg.task.min_len, cfg.task.max_len) == (task, 1, 16)
        # Learned positions must reach the 17..32 evaluation.
        made = make_task(cfg.task)
        needed = made.positions_for_source(made.max_source_len(32))
        assert position_shortfall(cfg.model, needed) is None


def test_train_refuses_a_range_shorter_than_the_sequences(tmp_path):
    # duplicate: targets of 2 * 6 symbols plus BOS need 13 positions, more than 10.
    result = run_cli("train", *TINY, "task.name=duplicate", "model.random_positions=10",
                     "--run-dir", tmp_path / "run")
    assert_clean_error(result, 2, "model.random_positions (10)", "13 positions")
    assert not (tmp_path / "run").exists()


# Training and evaluating beyond the trained lengths, through the CLI


@pytest.mark.parametrize("positional, limit", [(kind, None) for kind in POSITIONALS]
                         + [("rope", 24), ("learned", 24)])
def test_eval_beyond_the_trained_lengths(tmp_path, positional, limit):
    run_dir = tmp_path / "run"
    result = run_cli("train", *TINY, "train.steps=5", "train.eval_samples=20",
                     "log.tensorboard=false", f"model.positional={positional}",
                     f"model.random_positions={limit or 'null'}", "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    result = run_cli("eval", run_dir, "--min-len", "7", "--max-len", "10", "--samples", "40",
                     "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["per_length"]) == {"7", "8", "9", "10"}
    assert report["trained_lengths"] == [1, 6]


def test_learned_positions_beyond_max_len_say_so(tmp_path):
    run_dir = tmp_path / "run"
    train(load_config(None, [*TINY, "train.steps=5", "log.tensorboard=false",
                             "model.positional=learned", "model.max_len=12",
                             "model.random_positions=12"]), run_dir=run_dir)
    assert run_cli("eval", run_dir, "--min-len", "7", "--max-len", "11").exit_code == 0
    assert_clean_error(run_cli("eval", run_dir, "--max-len", "12"), 2, "model.max_len (12)")


def test_resume_is_bit_exact_with_random_positions(tmp_path):
    cfg = load_config(None, [*TINY, "model.positional=alibi", "model.random_positions=24",
                             "model.dropout=0.1", "train.steps=40", "log.log_every=1",
                             "train.eval_every=20", "train.target_exact_match=null",
                             "log.tensorboard=false"])
    train(cfg, run_dir=tmp_path / "straight")
    train(cfg, run_dir=tmp_path / "split", stop_at=20)
    train(None, resume=tmp_path / "split" / "checkpoints" / "last.pt")

    def losses(run_dir):
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]

    assert len(losses(tmp_path / "straight")) == 40
    assert losses(tmp_path / "straight") == losses(tmp_path / "split")
