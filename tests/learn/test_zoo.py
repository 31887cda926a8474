"""The bug zoo: each bug planted on a line of the book's function, caught as written, its fix
alone accepted; the zoo trains and evaluates without a crash; a folder is never written over."""

import ast
import importlib
import math
import shutil
import types

import pytest
import torch

from minitfm.config import load_config
from minitfm.learn import zoo
from minitfm.learn.code import code_for
from minitfm.learn.workbook import WorkbookError, book_source, find_function, load_workbook
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set, make_batch

BUG_IDS = [bug.id for bug in zoo.BUGS]


@pytest.fixture(scope="module")
def zoo_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo") / "bugs"
    zoo.write_zoo(folder)
    return folder


@pytest.mark.parametrize("bug", zoo.BUGS, ids=BUG_IDS)
def test_each_bug_sits_on_one_line_of_its_function_in_the_book(bug):
    source = book_source(bug.chapter)
    assert source.count(bug.line) == 1, "the book changed: move the bug to its new line"
    node = find_function(ast.parse(source), bug.name)
    assert node is not None, f"{bug.name} is not in minitfm/book/{bug.file}"
    line = source[:source.index(bug.line)].count("\n") + 1
    assert node.lineno <= line <= node.end_lineno
    assert "\n" not in bug.line + bug.bugged and bug.line != bug.bugged


def test_bugs_have_distinct_ids_and_symptoms_that_hide_the_place():
    assert len(set(BUG_IDS)) == len(BUG_IDS)
    assert len({bug.symptom for bug in zoo.BUGS}) == len(zoo.BUGS)
    for bug in zoo.BUGS:
        assert bug.file not in bug.symptom and bug.name.split(".")[-1] + "(" not in bug.symptom
        assert bug.symptom.endswith(".") and bug.symptom.count(". ") == 0, bug.symptom


def test_the_book_passes_every_checker():
    assert [bug.id for bug, fixed in zoo.check_book() if not fixed] == []


def test_the_zoo_is_a_zoo_with_every_bug_caught(zoo_folder):
    workbook = load_workbook(zoo_folder)
    assert workbook.kind == "zoo" and workbook.changed_in_book() == []
    assert [bug.id for bug, fixed in zoo.check_zoo(workbook) if fixed] == []
    readme = (zoo_folder / "README.md").read_text(encoding="utf-8")
    assert all(f"{n}. {bug.symptom}" in readme for n, bug in enumerate(zoo.BUGS, 1))
    assert not any(bug.line in readme or bug.bugged in readme for bug in zoo.BUGS)


@pytest.mark.parametrize("bug", zoo.BUGS, ids=BUG_IDS)
def test_fixing_one_bug_flips_its_checker_and_no_other(bug, zoo_folder, tmp_path):
    copy = tmp_path / "zoo"
    shutil.copytree(zoo_folder, copy)
    path = copy / bug.file
    text = path.read_text(encoding="utf-8")
    assert text.count(bug.bugged) == 1
    path.write_text(text.replace(bug.bugged, bug.line), encoding="utf-8")
    results = zoo.check_zoo(load_workbook(copy))
    assert [b.id for b, fixed in results if fixed] == [bug.id]


WRONG_FIXES = {  # a fix that looks plausible and is still wrong: no checker may accept it
    "no-scaling": "scores = q @ k.transpose(-2, -1) / d_k",
    "softmax-axis": "weights = scores.softmax(dim=0)",
    "causal-mask-leak": "return torch.ones(size, size, dtype=torch.bool, device=device).triu()",
    "exact-match-prefix": "self.exact += pred[:len(target)] == target",
    "dropout-not-rescaled": "return uniform.ge_(self.p).mul_(1.0 - self.p)",
    "adamw-no-bias-correction": "correction1, correction2 = 1 - beta1, 1 - beta2",
    "kv-cache-off-by-one": "return k, v",
    "positions-off-by-one": "offset = cache[0].self_attn.length - 1 if cache is not None else 0",
}


@pytest.mark.parametrize("bug_id, wrong", WRONG_FIXES.items(), ids=list(WRONG_FIXES))
def test_a_wrong_fix_is_not_accepted(bug_id, wrong, zoo_folder, tmp_path):
    bug = next(bug for bug in zoo.BUGS if bug.id == bug_id)
    copy = tmp_path / "zoo"
    shutil.copytree(zoo_folder, copy)
    path = copy / bug.file
    path.write_text(path.read_text(encoding="utf-8").replace(bug.bugged, wrong), encoding="utf-8")
    assert [b.id for b, fixed in zoo.check_zoo(load_workbook(copy)) if fixed] == []


@pytest.mark.parametrize("bug", zoo.BUGS, ids=BUG_IDS)
def test_a_blank_is_not_fixed(bug):
    def blank(*args, **kwargs):
        raise NotImplementedError(bug.name)

    book = importlib.import_module(f"minitfm.book.{bug.chapter}")
    module = types.ModuleType("blank")
    owner, _, method = bug.name.rpartition(".")
    if owner:
        base = getattr(book, owner)
        body = property(blank) if isinstance(vars(base)[method], property) else blank
        setattr(module, owner, type(owner, (base,), {method: body}))
    else:
        setattr(module, bug.name, blank)
    assert not zoo.is_fixed(bug, module)


def test_the_zoo_trains_and_evaluates_without_a_crash(zoo_folder):
    cfg = load_config(None, ["task.name=copy", "task.max_len=5", "model.d_model=16",
                             "model.n_heads=2", "model.d_ff=32", "model.dropout=0.1",
                             "train.batch_size=16", "train.warmup_steps=2"])
    code = code_for(str(zoo_folder))
    task = make_task(cfg.task)
    torch.manual_seed(0)
    model = code.build(cfg, task)
    loop = code.loop
    state = loop.TrainState(cfg, task, model, loop.make_optimizer(model, cfg.train),
                            torch.Generator().manual_seed(0))
    for _ in range(4):
        batch = make_batch(task.sample(16, state.data_rng), task.vocab)
        loss, grad_norm = loop.train_step(state, batch)
        assert torch.isfinite(loss) and torch.isfinite(grad_norm)
    result = code.metrics.evaluate(model, task, eval_set(task, 12, 0), "cpu")
    assert math.isfinite(result.loss) and 0.0 <= result.exact_match <= 1.0


def test_an_existing_folder_is_never_written_over(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "attention.py").write_text("my work\n", encoding="utf-8")
    with pytest.raises(WorkbookError, match="already exists"):
        zoo.write_zoo(folder)
    assert [p.name for p in folder.iterdir()] == ["attention.py"]
    assert (folder / "attention.py").read_text(encoding="utf-8") == "my work\n"


def test_a_wrong_fix_of_the_scaling_leaves_the_axis_fix_standing(tmp_path):
    """The two bugs of `attention`: fixing the axis and then the scaling wrongly (by d_k, not
    its root) keeps the axis fixed and the scaling not."""
    folder = tmp_path / "zoo"
    zoo.write_zoo(folder)
    text = (folder / "attention.py").read_text()
    text = text.replace("softmax(dim=-2)", "softmax(dim=-1)")
    text = text.replace("scores = q @ k.transpose(-2, -1)",
                        "scores = q @ k.transpose(-2, -1) / d_k", 1)
    (folder / "attention.py").write_text(text)
    fixed = {bug.id: done for bug, done in zoo.check_zoo(load_workbook(folder))}
    assert fixed["softmax-axis"] and not fixed["no-scaling"]


def test_the_json_names_a_bug_only_once_it_is_fixed(zoo_folder, tmp_path):
    """The README promises symptoms, not answers: `--json` gives a bug's id and mistake only
    once it is fixed, as the table does."""
    import json

    from tests.helpers import run_cli

    copy = tmp_path / "zoo"
    shutil.copytree(zoo_folder, copy)
    fixed = zoo.BUGS[0]
    path = copy / fixed.file
    path.write_text(path.read_text(encoding="utf-8").replace(fixed.bugged, fixed.line),
                    encoding="utf-8")
    result = run_cli("learn", "check", copy, "--json")
    assert result.exit_code == 1, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["number"] for row in rows] == list(range(1, len(zoo.BUGS) + 1))
    assert [row["symptom"] for row in rows] == [bug.symptom for bug in zoo.BUGS]
    assert rows[0]["fixed"] and rows[0]["bug"] == fixed.id and rows[0]["mistake"] == fixed.mistake
    for row in rows[1:]:
        assert not row["fixed"] and set(row) == {"number", "symptom", "fixed"}, row
    assert not any(bug.id in result.stdout for bug in zoo.BUGS[1:])
