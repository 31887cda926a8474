"""The CLI through Typer's CliRunner: help, version, --print-config, bad configs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from minitfm import __version__
from minitfm.app.cli import app
from minitfm.config import load_config
from tests.helpers import assert_clean_error, assert_clean_errors, command_names, run_cli

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = command_names()


def test_version():
    result = run_cli("--version")
    assert result.exit_code == 0 and __version__ in result.stdout


def listed_in_help(help_text: str) -> list[str]:
    """The command names in the Commands panel of `minitfm --help`, in order."""
    panel = help_text.split("Commands", 1)[1].split("╰", 1)[0]
    return re.findall(r"^│ (\S+) ", panel, re.M)


def test_help_lists_every_command_and_no_other():
    result = run_cli("--help")
    assert result.exit_code == 0
    assert listed_in_help(result.stdout) == COMMANDS
    assert {"train", "eval", "plot", "ablate", "runs"} <= set(COMMANDS)  # the list is real


def test_readme_table_lists_every_command_and_no_other():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `minitfm ([a-z][a-z-]*)", readme, re.M)
    assert sorted(listed) == sorted(COMMANDS), "README's command table and the CLI differ"


def test_the_table_of_commands_is_the_help():
    """app/cli.py's COMMANDS, in its order, is what `minitfm --help` lists (the hidden one left
    out) and what Typer registered."""
    from minitfm.app import cli

    shown = [name for name in cli.COMMANDS if not cli.SETTINGS.get(name, {}).get("hidden")]
    assert listed_in_help(run_cli("--help").stdout) == shown == COMMANDS
    assert [name for name in cli.COMMANDS if name not in shown] == ["stack"]


def test_each_module_of_app_commands_holds_one_command_of_the_table():
    """One module per command: a module of app/commands/ that the table does not name, or a
    command of the table that lives elsewhere, fails here."""
    from minitfm.app import cli

    def home(command) -> str:
        """The module that defines a command (a group's: its commands' module)."""
        if isinstance(command, typer.Typer):
            command = command.registered_commands[0].callback
        return command.__module__

    folder = ROOT / "minitfm" / "app" / "commands"
    modules = [f"minitfm.app.commands.{path.stem}" for path in sorted(folder.glob("*.py"))]
    assert sorted(map(home, cli.COMMANDS.values())) == \
        [name for name in modules if not name.endswith("__init__")]


def test_no_command_builds_its_options_by_position():
    """A command builds its options class (lab/options.py) from its parameters by name
    (`options_from`), the Python API by keyword: sweep's 11 positional arguments, in another
    order than its parameters', could swap two of them without a word."""
    import ast

    calls = [f"{path.name}: {ast.unparse(node)}"
             for path in sorted((ROOT / "minitfm" / "app").rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Options")
             and node.args]
    assert calls == []


def test_the_apps_packages_name_all_their_modules():
    """app/'s and app/commands/'s docstrings are their maps: each names all its modules."""
    for folder in (ROOT / "minitfm" / "app", ROOT / "minitfm" / "app" / "commands"):
        doc = (folder / "__init__.py").read_text(encoding="utf-8")
        rooms = [path.stem for path in sorted(folder.iterdir()) if path.suffix == ".py"
                 or (path / "__init__.py").is_file()]
        missing = [room for room in rooms if room != "__init__"
                   and not re.search(rf"\b{room}\b", doc)]
        assert not missing, f"{folder.name}/__init__.py does not name {missing}"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_real_help(command):
    result = run_cli(command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.stdout and len(result.stdout.splitlines()) > 5


def test_usage_mistakes_are_one_line():
    assert_clean_error(run_cli("train", "--bogus"), 2, "No such option: --bogus",
                       "(see 'minitfm train --help')")
    assert_clean_error(run_cli("nosuch"), 2, "No such command 'nosuch'", "(see 'minitfm --help')")


def test_a_subcommands_usage_mistake_points_at_its_whole_command():
    assert_clean_error(run_cli("learn", "check", "--bogus"), 2, "No such option: --bogus",
                       "(see 'minitfm learn check --help')")
    assert_clean_error(run_cli("learn", "start", "--bogus"), 2,
                       "(see 'minitfm learn start --help')")
    assert_clean_error(run_cli("learn", "nosuch"), 2, "(see 'minitfm learn --help')")


@pytest.mark.parametrize("args, needle", [
    (["train", "--steps", "100"], "no option --steps: set it as train.steps=100"),
    (["train", "--steps=100"], "no option --steps: set it as train.steps=100"),
    (["train", "--warmup-steps", "5"], "no option --warmup-steps: set it as "
                                       "train.warmup_steps=5"),
    (["train", "--seed", "3"], "no option --seed: set it as seed=3"),
    (["train", "--max-len"], "no option --max-len: set it as task.max_len=VALUE or "
                             "model.max_len=VALUE"),
    (["sweep", "--lr", "1e-3,3e-3"], "no option --lr: set it as train.lr=1e-3,3e-3"),
])
def test_an_option_that_is_a_config_key_points_to_key_value(args, needle):
    assert_clean_error(run_cli(*args), 2, needle, f"(see 'minitfm {args[0]} --help')")


def test_help_texts_keep_their_brackets():
    """Typer shows help as Rich markup, which reads `[ray]` as a style and drops it (`sweep
    --help` said `pip install 'minitfm'`): every command's and option's help shows as written."""
    from rich.text import Text

    def walk(command, name="minitfm"):
        yield name, command
        for sub, found in getattr(command, "commands", {}).items():
            yield from walk(found, f"{name} {sub}")

    for name, command in walk(typer.main.get_command(app)):
        for text in [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]:
            assert Text.from_markup(text).plain == text.replace("\\[", "["), (name, text)
    help_text = " ".join(run_cli("sweep", "--help").stdout.replace("│", " ").split())
    assert "pip install 'minitfm[ray]'" in help_text


def test_help_loads_no_torch_and_no_private_module():
    code = ("import sys\nfrom minitfm.app.cli import app\ntry:\n    app(['--help'])\n"
            "except SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.splitlines()[-1] == "0 False", result.stdout[-500:] + result.stderr
    for path in (ROOT / "minitfm").glob("*.py"):  # e.g. typer._click: it moves between versions
        assert not re.search(r"^\s*(from|import) \w+\._", path.read_text(), re.M), path


def test_print_config_with_overrides(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("task:\n  name: copy\ntrain:\n  lr: 3e-4\n")
    result = run_cli("train", "--print-config", config, "model.d_model=128", "train.steps=500")
    assert result.exit_code == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["task"]["name"] == "copy" and resolved["train"]["lr"] == 0.0003
    assert resolved["model"]["d_model"] == 128 and resolved["train"]["steps"] == 500


def test_print_config_default_is_reverse():
    result = run_cli("train", "--print-config")
    assert result.exit_code == 0 and yaml.safe_load(result.stdout)["task"]["name"] == "reverse"


BAD = [
    (["model.d_modle=64"], "model.d_modle"),
    (["model.d_model=30"], "model.d_model (30)"),
    (["train.lr=-1"], "train.lr"),
    (["model.dropout=1.5"], "model.dropout"),
    (["task.min_len=9", "task.max_len=3"], "task.min_len (9)"),
    (["task.name=sorting"], "task.name"),
    (["device=tpu"], "device"),
    (["nonsense"], "nonsense"),
    (["missing.yaml"], "missing.yaml"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_config_exits_2_and_writes_nothing(tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    result = run_cli("train", *args)
    assert_clean_error(result, 2, needle)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text,needle", [
    ("", "empty"), ("[1, 2]", "mapping"), ("task:\n  name: [copy\n", "line"),
    ("task:\n  nme: copy\n", "task.name"),
])
def test_bad_config_files(tmp_path, monkeypatch, text, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    result = run_cli("train", "bad.yaml")
    assert_clean_error(result, 2, needle)
    assert [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]


def test_directory_as_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    assert_clean_error(run_cli("train", "configs"), 2, "directory")


def test_tasks_lists_every_task():
    result = run_cli("tasks")
    assert result.exit_code == 0
    for name in ["copy", "reverse", "sort", "duplicate", "shift", "add"]:
        assert name in result.stdout


def test_run_commands_without_runs_say_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("eval"), 2, "no runs")
    assert_clean_error(run_cli("predict", "1 2 3"), 2, "no runs")


SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))


def example_data(config: Path, folder: Path) -> list[str]:
    """For a pairs config, small data made by the make_data.py beside its files (a fresh clone
    has none), and the overrides that point the config at it."""
    task = load_config(config).task
    if task.name != "pairs":
        return []
    maker = Path(task.train_path).parent / "make_data.py"
    subprocess.run([sys.executable, maker, "--out", folder, "--train", "300", "--eval", "30"],
                   check=True, capture_output=True)
    return [f"task.{key}={folder / f'{split}.tsv'}" for key, split in
            (("train_path", "train"), ("eval_path", "eval")) if getattr(task, key)]


@pytest.mark.slow
@pytest.mark.parametrize("config", SHIPPED, ids=lambda path: path.stem)
def test_every_shipped_config_trains_evaluates_and_visualizes(tmp_path, config):
    run_dir, png = tmp_path / "run", tmp_path / "attention.png"
    result = run_cli("train", config, *example_data(config, tmp_path / "data"),
                     "train.steps=2", "train.batch_size=16",
                     "train.eval_samples=20", "log.tensorboard=false", "log.attention_every=0",
                     "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    result = run_cli("eval", run_dir, "--samples", "20", "--json")
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load(result.stdout)["step"] == 2
    result = run_cli("visualize-attention", run_dir, "--no-terminal", "--out", png)
    assert result.exit_code == 0, result.stderr
    assert png.stat().st_size > 0


# --- the default RUN: named with its score, a learner's run only when there is no other ---

@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """runs/plain, a tiny trained run, and runs/zoo, the same with model.code a folder (as a
    workbook's or bug zoo's run says), its checkpoints newer."""
    import os
    import shutil

    from tests.helpers import TINY

    root = tmp_path_factory.mktemp("cwd")
    plain = root / "runs" / "plain"
    result = run_cli("train", *TINY, "train.steps=4", "train.eval_every=2",
                     "train.eval_samples=20", "log.tensorboard=false", "threads=1",
                     "--run-dir", plain)
    assert result.exit_code == 0, result.stderr
    zoo = shutil.copytree(plain, root / "runs" / "zoo")
    config = zoo / "config.yaml"
    config.write_text(config.read_text().replace("code: fast", f"code: {root / 'bugs'}"))
    newer = (plain / "checkpoints").stat().st_mtime + 60
    os.utime(zoo / "checkpoints", (newer, newer))
    return root


def test_a_left_out_run_is_named_with_its_score_and_skips_a_learners_run(trained_runs,
                                                                          monkeypatch):
    monkeypatch.chdir(trained_runs)
    for args in (["predict", "1 2 3"], ["eval", "--samples", "5"], ["plot"]):
        result = run_cli(*args)
        assert result.exit_code == 0, result.stderr
        assert re.search(r"note: no RUN given: using runs/plain \(best exact match \d+\.\d%\), "
                         r"the most recent run not trained by a workbook or bug zoo \(1 newer "
                         r"is: give one as RUN to use it\)", result.stderr), (args, result.stderr)
    given = run_cli("predict", "runs/zoo", "1 2 3")
    assert given.exit_code == 0 and "no RUN given" not in given.stderr


def test_a_learners_run_is_the_default_only_when_there_is_no_other(trained_runs, tmp_path,
                                                                  monkeypatch):
    import shutil

    shutil.copytree(trained_runs / "runs" / "zoo", tmp_path / "runs" / "zoo")
    monkeypatch.chdir(tmp_path)
    result = run_cli("predict", "1 2 3")
    assert result.exit_code == 0, result.stderr
    assert re.search(r"note: no RUN given: using runs/zoo \(best exact match \d+\.\d%\), a "
                     r"workbook's or bug zoo's run, as there is no other", result.stderr)


@pytest.mark.parametrize("args, needle", [
    (["eval", "--samples", "5", "--samples=7"], "--samples is given 2 times: give it once"),
    (["sweep", "configs/copy.yaml", "--seeds", "0", "--stack", "--no-stack"],
     "--stack and --no-stack are both given: give one of them"),
    (["predict", "--threads", "1", "--threads", "2", "3 1"],
     "--threads is given 2 times"),
    (["ablate", "--mode", "zero", "--mode", "mean"], "--mode is given 2 times"),
])
def test_an_option_given_twice_is_one_line_not_the_last_one_kept(args, needle):
    """Click keeps the last of an option given twice, silently: `--threads 1 --threads 2`
    ran with 2. Refused before anything runs; an option that takes several is not counted."""
    assert_clean_error(run_cli(*args), 2, needle)


@pytest.mark.parametrize("args, needle", [
    (["eval", "run"], "run 'run' not found"),
    (["runs", "folder"], "'folder'"),
    (["compare", "args", "x"], "(got 2 arguments)"),
])
def test_a_word_spelled_as_an_arguments_name_is_that_argument(args, needle, tmp_path,
                                                             monkeypatch):
    """A positional argument has a name too (`run`, `folder`, `args`): a word on the command
    line spelled so is the argument's value, never counted as an option given twice (it was a
    traceback: an argument has no `is_flag`)."""
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert result.exit_code == 2 and "Traceback" not in result.stdout + result.stderr, result
    assert needle in result.stderr, result.stderr


@pytest.mark.parametrize("args, needles", [
    (["train.steps=2", "train.steps=3"], ["train.steps is given twice (2, 3): give it once"]),
    (["seed=1", "seed=2"], ["seed is given twice (1, 2): give it once"]),
    (["seed=1", "train.lr=0.1", " seed =3", "train.lr=1e-2", "seed=1"],
     ["seed is given 3 times (1, 3, 1)", "train.lr is given twice (0.1, 1e-2)"]),
    (["--resume", "runs/nowhere", "train.steps=2", "train.steps=3"],
     ["train.steps is given twice (2, 3)"]),
])
def test_a_config_key_given_twice_is_refused_not_the_last_one_kept(tmp_path, monkeypatch, args,
                                                                   needles):
    """L2: `train.steps=2 train.steps=3` trained 3 steps without a word; a problem a line."""
    monkeypatch.chdir(tmp_path)
    assert_clean_errors(run_cli("train", *args, as_typed=True), 2, *needles)
    assert list(tmp_path.iterdir()) == []


def test_every_mistake_of_a_config_is_said_at_once(tmp_path, monkeypatch):
    """A line per problem (it said the first, `(and 1 more)`): the overrides' and the file's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.yaml").write_text('train:\n  steps: "600"\n  learning_rate: 1\n')
    assert_clean_errors(run_cli("train", "two.yaml"), 2, "train.steps ('600'): input should be a "
                        "valid integer", "unknown config key 'train.learning_rate'")
    assert_clean_errors(run_cli("train", "two.yaml", "model.d_modle=3", "model.dropout=2",
                                "--print-config"), 2,
                        "unknown config key 'model.d_modle' (did you mean 'model.d_model'?)",
                        "model.dropout (2): input should be less than 1", "train.steps ('600')",
                        "unknown config key 'train.learning_rate'")
    assert_clean_error(run_cli("train", "model.dropout=2"), 2, "model.dropout (2)")  # one: a line
    assert [p.name for p in tmp_path.iterdir()] == ["two.yaml"]


def test_a_value_that_looks_like_an_option_is_no_second_option():
    """The token after a value option is its value: `--out --out` writes to a folder named
    '--out' rather than counting the option twice."""
    result = run_cli("sweep", "configs/copy.yaml", "--seeds", "0", "--out", "--out",
                     "--dry-run")
    assert "given 2 times" not in result.stderr
