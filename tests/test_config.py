"""Config loading, overrides and validation (no torch needed)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from minitfm.catalog import TASKS
from minitfm.config import Config, load_config, parse_threads, to_yaml
from minitfm.errors import ConfigError
from tests.imports import imported_modules

CONFIGS = sorted(Path(__file__).parent.parent.joinpath("configs").glob("*.yaml"))


def test_defaults_are_the_reverse_task():
    cfg = load_config()
    assert cfg.task.name == "reverse" and (cfg.task.min_len, cfg.task.max_len) == (1, 16)
    assert cfg.device == "auto" and cfg.log.dir == "runs"


def test_overrides_parse_yaml_scalars():
    cfg = load_config(None, ["train.lr=3e-4", "model.n_heads=8", "train.target_exact_match=null",
                             "model.norm_first=false", "name=exp1"])
    assert cfg.train.lr == 0.0003 and isinstance(cfg.train.lr, float)
    assert cfg.model.n_heads == 8 and cfg.train.target_exact_match is None
    assert cfg.model.norm_first is False and cfg.name == "exp1"


def test_float_in_file_and_override_agree(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 3e-4\n")
    assert yaml.safe_load(path.read_text())["train"]["lr"] == "3e-4"  # PyYAML's quirk
    assert load_config(path).train.lr == load_config(None, ["train.lr=3e-4"]).train.lr == 3e-4


def test_override_beats_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 32\ntrain:\n  steps: 10\n")
    cfg = load_config(path, ["train.steps=20"])
    assert (cfg.model.d_model, cfg.train.steps) == (32, 20)


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(None, ["model.d_model=128", "train.grad_clip=null"])
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.task.name in TASKS


def test_reverse_config_is_the_default():
    assert load_config(Path(__file__).parent.parent / "configs" / "reverse.yaml") == Config()


def test_every_task_has_a_config():
    names = {load_config(p).task.name for p in CONFIGS}
    assert names == set(TASKS)


def readme_config_table() -> dict[str, str]:
    """docs/config.md's table of shipped configs: `name.yaml` -> the first cell of its row."""
    text = (Path(__file__).parent.parent / "docs" / "config.md").read_text(encoding="utf-8")
    section = text.split("## Shipped configs")[1].split("\n## ")[0]
    cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {re.search(r"`([\w-]+\.yaml)`", cell).group(1): cell for cell in cells}


def test_readme_table_lists_every_task_config_with_its_steps():
    """Results live in one place, docs/config.md's table: configs carry none in their comments."""
    table = readme_config_table()
    for path in CONFIGS:
        if path.name.startswith("lengthgen-"):
            continue  # measured in docs/experiments.md's "Length generalisation" tables
        assert path.name in table, f"docs/config.md's config table has no row for {path.name}"
        steps = re.search(r"(\d+) steps", table[path.name])
        expected = int(steps.group(1)) if steps else Config().train.steps
        assert load_config(path).train.steps == expected, f"{path.name}: steps differ"
        comments = [line for line in path.read_text().splitlines() if "#" in line]
        measured = [c for c in comments if re.search(r"\d\.\d+%|at step \d", c)]
        assert not measured, f"{path.name}: a measured result in a comment: {measured}"


BAD_OVERRIDES = [
    (["model.d_modle=64"], "did you mean 'model.d_model'"),
    (["modle.d_model=64"], "did you mean 'model'"),
    (["model.d_model=30"], "model.d_model (30) must be divisible by model.n_heads (4)"),
    (["model.d_model=0"], "model.d_model"),
    (["train.steps=-5"], "train.steps"),
    (["train.lr=0"], "train.lr"),
    (["train.lr=fast"], "train.lr"),
    (["model.dropout=1.0"], "model.dropout"),
    (["model.dropout=-0.1"], "model.dropout"),
    (["task.min_len=5", "task.max_len=3"], "task.min_len (5) must be <= task.max_len (3)"),
    (["task.name=revers"], "did you mean 'reverse'"),
    (["model.positional=rotary"], "model.positional"),
    (["train.schedule=linear"], "train.schedule"),
    (["model.code="], "model.code"),
    (["device=gpu"], "device"),
    (["model=3"], "'model' is a section"),
    (["train.steps"], "must look like key=value"),
    (["train.steps.x=1"], "'train.steps' is a key"),
    (["model.d_model=[1, 2]"], "single value"),
    (["steps=100"], "unknown config key 'steps' (did you mean 'train.steps'?)"),
    (["step=100"], "(did you mean 'train.steps'?)"),
    (["d_model=64"], "(did you mean 'model.d_model'?)"),
    (["max_len=8"], "(did you mean 'task.max_len' or 'model.max_len'?)"),
]


@pytest.mark.parametrize("overrides,message", BAD_OVERRIDES)
def test_bad_overrides_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_config_with_several_mistakes_names_them_all():
    """Every wrong override and key at once, a problem each (the command line prints a line
    each); the message joins them."""
    with pytest.raises(ConfigError) as err:
        load_config(None, ["model.d_modle=64", "train.steps=abc", "model.dropout=1.5"])
    assert err.value.problems() == [
        "unknown config key 'model.d_modle' (did you mean 'model.d_model'?)",
        "model.dropout (1.5): input should be less than 1",
        "train.steps ('abc'): input should be a valid integer"]
    assert str(err.value) == "; ".join(err.value.problems())


BAD_FILES = [
    ("", "is empty"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("model:\n  d_model: 64\n bad indent: 1\n", "line 3"),
    ("model: 3\n", "'model' must be a mapping"),
    ("trian:\n  steps: 3\n", "did you mean 'train'"),
    ("train:\n  stpes: 3\n", "did you mean 'train.steps'"),
    ("steps: 3\n", "unknown config key 'steps' (did you mean 'train.steps'?)"),
    ("task:\n  name: !!python/object/apply:os.system ['echo hi']\n", "not valid YAML"),
]


@pytest.mark.parametrize("text,message", BAD_FILES)
def test_bad_files_are_clear(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_the_registries_cover_the_catalog_exactly():
    # The catalog states the names (torch-free, for validation); the implementations register
    # under them, in its order: a class per task, a builder per positional scheme.
    from minitfm import catalog
    from minitfm.book.positions import SCHEMES, PositionalEncoding, make_positional
    from minitfm.tasks import TASKS as IMPLEMENTATIONS

    assert tuple(IMPLEMENTATIONS) == tuple(catalog.TASKS)
    assert all(cls.name == name for name, cls in IMPLEMENTATIONS.items())
    assert tuple(SCHEMES) == tuple(catalog.POSITIONALS)
    for name in catalog.POSITIONALS:
        assert isinstance(make_positional(name, 8, 8, 2), PositionalEncoding)


def test_attention_snapshots_every_25_steps_and_gauges_every_10_by_default():
    """Dense enough to watch the maps form and to forecast the click (#50)."""
    assert Config().log.attention_every == 25 and Config().log.gauge_every == 10
    assert load_config(None, ["log.attention_every=eval"]).log.attention_every == "eval"
    assert load_config(None, ["log.attention_every=40"]).log.attention_every == 40
    for bad in ("sometimes", "-1", "true"):
        with pytest.raises(ConfigError, match=r"log.attention_every .* must be eval"):
            load_config(None, [f"log.attention_every={bad}"])


def test_config_imports_only_the_kernel():
    # The kernel: a config reads the same without torch and on any machine.
    imported = imported_modules(Path(__file__).parent.parent / "minitfm" / "config.py")
    assert {name for name in imported if name.split(".")[0] == "minitfm"} == \
        {"minitfm.errors", "minitfm.overrides", "minitfm.schema", "minitfm.yamlfile"}
    code = ("import sys\nfrom minitfm.config import load_config\nload_config()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('minitfm', 'torch'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == ("['minitfm', 'minitfm.catalog', 'minitfm.config', "
                                     "'minitfm.errors', 'minitfm.overrides', 'minitfm.schema', "
                                     "'minitfm.version', 'minitfm.yamlfile']"), \
        result.stdout + result.stderr[-500:]


def test_loading_a_config_does_not_measure_the_machine():
    # Whether it fits this machine is asked where a run starts (tests/test_refuse_inputs.py).
    assert load_config(None, ["train.batch_size=1000000"]).train.batch_size == 1_000_000


def test_threads_are_auto_or_a_positive_count():
    assert parse_threads(" AUTO ") == "auto" and parse_threads("3") == parse_threads(3) == 3
    for bad in ("0", "-1", "many", "2.5"):
        with pytest.raises(ValueError, match="must be auto or a positive integer"):
            parse_threads(bad)
