"""Tasks: targets against independent computations, sampling, the held-out split, text I/O."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import catalog
from minitfm.catalog import position_shortfall, positions_needed
from minitfm.config import TaskConfig, load_config
from minitfm.errors import ConfigError, TaskInputError
from minitfm.run.limits import sequence_lengths
from minitfm.tasks import TASKS, make_task
from minitfm.tasks.base import (
    BOS_ID,
    EOS_ID,
    MIN_HOLDOUT_SPACE,
    PAD_ID,
    Task,
    Vocab,
    eval_set,
    make_batch,
)
from minitfm.tasks.synthetic import SYNTHETIC
from tests.imports import imported_modules

SYNTHETIC_TASKS = [name for name, spec in catalog.TASKS.items() if not spec.from_files]
# Tasks whose inputs have a length (task.min_len..max_len); modadd's are two one-symbol numbers
# (tests/tasks/test_grokking.py holds it to its own rule).
LENGTH_TASKS = [name for name in SYNTHETIC_TASKS if name != "modadd"]
SEQUENCE_RULES = {
    "copy": lambda v: list(v),
    "reverse": lambda v: v[::-1],
    "sort": sorted,
    "duplicate": lambda v: [x for x in v for _ in range(2)],
    "shift": lambda v: v[1:] + v[:1],
}


def task(name: str, **kw) -> Task:
    return make_task(TaskConfig(name=name, **kw))


def values(t: Task, ids: list[int]) -> list[int]:
    """Ids -> symbol values, read from the vocabulary's token strings."""
    return [int(t.vocab.token(i)) for i in ids]


def draw(t: Task, n: int, seed: int, **kw):
    return t.sample(n, torch.Generator().manual_seed(seed), **kw)


def add_operands(t: Task, src: list[int]) -> tuple[str, str]:
    a, b = t.format(src).replace(" ", "").split("+")
    return a, b


# --- registry and vocabulary ---

def test_registry_matches_the_catalog():
    assert tuple(TASKS) == tuple(catalog.TASKS)
    for name, cls in TASKS.items():
        assert cls.name == name and cls.summary and "->" in cls.__doc__


def test_synthetic_names_match_the_catalog():
    assert [cls.name for cls in SYNTHETIC] == SYNTHETIC_TASKS


def test_the_task_modules_import_down_only():
    # base knows no task; each task module knows only base; the package names them all.
    folder = Path(__file__).resolve().parents[2] / "minitfm" / "tasks"
    wanted = {"base": set(), "synthetic": {"minitfm.tasks.base"}, "pairfiles": set(),
              "pairs": {"minitfm.tasks.base", "minitfm.tasks.pairfiles"}}
    for name, allowed in wanted.items():
        found = imported_modules(folder / f"{name}.py")  # `from .base import x` too
        assert {m for m in found if m.startswith("minitfm.tasks")} == allowed, name


@pytest.mark.parametrize("name", LENGTH_TASKS)
def test_the_sizes_the_memory_check_reads_are_the_tasks(name):
    # The catalog states them once, without torch; the tasks and run.limits both read them.
    t, spec = task(name), catalog.TASKS[name]
    pairs = draw(t, 300, 0, min_len=6, max_len=6)
    assert max(len(src) for src, _ in pairs) == spec.longest_source(6) == t.max_source_len(6)
    assert max(len(tgt) for _, tgt in pairs) == spec.longest_target(6)
    assert all(len(tgt) <= t.max_target_len(len(src)) for src, tgt in pairs)
    assert len(t.vocab) == spec.vocab_size(t.n_symbols)
    assert sequence_lengths(name, 6) == (spec.longest_source(6), spec.longest_target(6) + 1)
    # The sweep's count from the config alone is the run's count from the task.
    assert spec.positions_for_inputs(6) == t.positions_for_source(t.max_source_len(6))


def test_outside_the_tasks_package_no_module_imports_a_task():
    # The run and the lab reach a task through the registry (make_task, TASKS) and its
    # methods, such as the check of a checkpoint's task data (Task.saved_problem).
    root = Path(__file__).resolve().parents[2] / "minitfm"
    for path in root.rglob("*.py"):
        if path.parent.name != "tasks":
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"^\s*(from|import) minitfm\.tasks\.(pairs|synthetic)\b", text,
                                 re.M), path
    assert all(cls.saved_problem({"vocab": []}) is None for cls in SYNTHETIC)


def test_vocab_layout():
    copy = task("copy", n_symbols=4)
    assert copy.vocab.tokens == ("<pad>", "<bos>", "<eos>", "0", "1", "2", "3")
    add = task("add", n_symbols=3)
    assert add.vocab.tokens == ("<pad>", "<bos>", "<eos>", "+", "0", "1", "2")
    assert (add.vocab.pad_id, add.vocab.bos_id, add.vocab.eos_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert len(add.vocab) == 7 and add.vocab.id("+") == 3 and add.vocab.token(4) == "0"


def test_vocab_errors():
    vocab = task("copy").vocab
    with pytest.raises(TaskInputError, match="'x'"):
        vocab.id("x")
    with pytest.raises(IndexError, match="99"):
        vocab.token(99)
    with pytest.raises(IndexError):
        vocab.token(-1)
    with pytest.raises(ValueError):
        Vocab(("0", "1"))


def test_add_rejects_more_than_ten_symbols():
    # The config refuses it, so --print-config and train agree (adversarial report L14).
    with pytest.raises(ConfigError, match=r"task.n_symbols \(11\) must be at most 10"):
        load_config(None, ["task.name=add", "task.n_symbols=11"])


# --- targets against independent computations ---

@pytest.mark.parametrize("name", SEQUENCE_RULES)
@pytest.mark.parametrize("n_symbols", [2, 10, 13])
def test_sequence_targets(name, n_symbols):
    t = task(name, n_symbols=n_symbols, min_len=1, max_len=12)
    for src, tgt in draw(t, 200, seed=0):
        assert values(t, tgt) == SEQUENCE_RULES[name](values(t, src))
        assert t.target(src) == tgt


@pytest.mark.parametrize("base", [2, 7, 10])
def test_add_targets_against_int_arithmetic(base):
    t = task("add", n_symbols=base, min_len=1, max_len=6)
    for src, tgt in draw(t, 300, seed=1):
        a, b = add_operands(t, src)
        assert 1 <= len(a) <= 6 and 1 <= len(b) <= 6
        assert len(a) == 1 or a[0] != "0", "sampled operands have no leading zero"
        assert len(b) == 1 or b[0] != "0"
        total = t.format(tgt).replace(" ", "")
        assert int(total, base) == int(a, base) + int(b, base)
        assert total == "0" or total[0] != "0", "the sum has no leading zero"


@pytest.mark.parametrize("text, expected, base", [
    ("12+34", "4 6", 10), ("99+1", "1 0 0", 10), ("0+0", "0", 10), ("007+1", "8", 10),
    ("11+1", "1 0 0", 2), ("66+1", "1 0 0", 7),
])
def test_add_worked_examples(text, expected, base):
    t = task("add", n_symbols=base)
    assert t.format(t.target(t.parse(text))) == expected


def test_hand_worked_targets():
    for name, text, expected in [("copy", "3 1 4", "3 1 4"), ("reverse", "3 1 4", "4 1 3"),
                                 ("sort", "3 1 4 1", "1 1 3 4"),
                                 ("duplicate", "1 2 3", "1 1 2 2 3 3"),
                                 ("shift", "1 2 3 4", "2 3 4 1")]:
        t = task(name)
        assert t.format(t.target(t.parse(text))) == expected


@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
def test_examples_are_correct(name):
    for n_symbols in (2, 10):
        t = task(name, n_symbols=n_symbols)
        text, target = t.example()
        assert t.format(t.target(t.parse(text))) == target


@pytest.mark.parametrize("name", LENGTH_TASKS)
def test_max_lengths_bound_samples(name):
    t = task(name, n_symbols=10, min_len=1, max_len=7)
    for src, tgt in draw(t, 300, seed=2):
        assert len(tgt) <= t.max_target_len(len(src))
        assert len(src) <= t.max_source_len(7)
        assert 1 <= t.input_length(src) <= 7
    longest = t.parse("9999999+9999999" if name == "add" else "9999999")
    assert len(longest) == t.max_source_len(7)
    assert len(t.target(longest)) <= t.max_target_len(len(longest))


def test_position_shortfall_is_the_one_length_check():
    def model(**kw):
        return load_config(None, [f"model.{k}={v}" for k, v in kw.items()]).model

    def short(model, t, src_len, training=False):
        return position_shortfall(model, t.positions_for_source(src_len), training)

    assert positions_needed(11, 11) == 12 and positions_needed(12, 3) == 12  # BOS + target
    learned, duplicate = model(positional="learned", max_len=12), task("duplicate")
    assert short(learned, task("copy"), 11) is None  # 11 source, BOS + 11 target
    assert short(learned, task("copy"), 12) == ("model.max_len", 12, 13)
    assert short(learned, duplicate, 5) is None  # BOS + 10 target
    assert short(learned, duplicate, 6) == ("model.max_len", 12, 13)
    assert short(model(), task("copy"), 10_000) is None  # sinusoids have no end
    randomized = model(positional="rope", random_positions=20)
    assert short(randomized, task("copy"), 30) is None  # evaluation: 0..n-1
    assert short(randomized, task("copy"), 20, training=True) == \
        ("model.random_positions", 20, 21)


# --- alignment ---

def test_alignments_hand_worked():
    src = [3, 1, 3, 0]  # raw ids are enough: alignments only compare and count them
    assert task("copy").alignment(src) == [0, 1, 2, 3]
    assert task("reverse").alignment(src) == [3, 2, 1, 0]
    assert task("sort").alignment(src) == [3, 1, 0, 2]  # ties keep source order
    assert task("duplicate").alignment([5, 6]) == [0, 0, 1, 1]
    assert task("shift").alignment(src) == [1, 2, 3, 0]
    assert task("add").alignment(task("add").parse("12+34")) is None


@pytest.mark.parametrize("name", ["copy", "reverse", "sort", "duplicate", "shift"])
def test_alignment_points_at_the_target_symbol(name):
    t = task(name)
    for src, tgt in draw(t, 100, seed=3):
        assert [src[j] for j in t.alignment(src)] == tgt


# --- sampling: determinism, lengths ---

@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
def test_same_seed_same_samples(name):
    t = task(name)
    assert draw(t, 64, seed=5) == draw(t, 64, seed=5)
    assert draw(t, 64, seed=5) != draw(t, 64, seed=6)
    assert eval_set(t, 64, 7) == eval_set(t, 64, 7)


def test_sampling_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    draw(task("sort"), 128, seed=1)
    eval_set(task("add"), 32, seed=1)
    assert torch.equal(torch.rand(3), expected)


def test_eval_set_is_pinned():
    # Changing the held-out rule or the draw order silently changes every eval set.
    t = task("copy", n_symbols=10)
    pairs = eval_set(t, 4, seed=0, min_len=5, max_len=5)
    assert [t.format(src) for src, _ in pairs] == ["1 4 9 9 5", "0 3 8 9 2", "5 8 8 0 5",
                                                    "8 5 8 6 5"]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_lengths_uniform_in_both_splits(split):
    # Lengths 1..3 are shared, 4..8 are held-out-able: the redraw must not skew lengths.
    t = task("reverse", n_symbols=10)
    counts = Counter(len(src) for src, _ in draw(t, 1600, seed=4, min_len=1, max_len=8,
                                                  split=split))
    assert sorted(counts) == list(range(1, 9))
    assert all(140 <= c <= 260 for c in counts.values()), counts


def test_bad_length_range_and_split():
    t = task("copy")
    with pytest.raises(ConfigError, match=r"min_len \(5\)"):
        draw(t, 4, seed=0, min_len=5, max_len=3)
    with pytest.raises(ConfigError):
        draw(t, 4, seed=0, min_len=0, max_len=3)
    with pytest.raises(ValueError, match="split"):
        draw(t, 4, seed=0, split="test")


# --- held-out split ---

@pytest.mark.parametrize("name, n_symbols, lo, hi", [
    ("reverse", 10, 1, 8), ("sort", 2, 10, 16), ("duplicate", 13, 1, 6), ("add", 10, 1, 4),
])
def test_train_and_eval_are_disjoint(name, n_symbols, lo, hi):
    t = task(name, n_symbols=n_symbols, min_len=lo, max_len=hi)
    held_out = {tuple(src) for src, _ in eval_set(t, 500, seed=123)}
    stream = [src for step in range(20) for src, _ in draw(t, 128, seed=step)]
    for src in stream:
        assert not t.is_held_out(src)
    for src in held_out:
        big = t._space(t._shape(list(src))) >= MIN_HOLDOUT_SPACE
        assert t.is_held_out(list(src)) == big
    shared = held_out & {tuple(src) for src in stream}
    assert all(t._space(t._shape(list(src))) < MIN_HOLDOUT_SPACE for src in shared)


def test_disjoint_beyond_trained_lengths():
    t = task("copy", n_symbols=10, min_len=1, max_len=8)
    longer = eval_set(t, 200, seed=9, min_len=9, max_len=12)
    assert all(t.is_held_out(src) for src, _ in longer)
    assert not any(t.is_held_out(src) for src, _ in draw(t, 500, seed=0, min_len=9, max_len=12))


def test_short_lengths_are_shared():
    t = task("copy", n_symbols=10)
    assert not any(t.is_held_out(src) for src, _ in eval_set(t, 100, seed=0, max_len=3))
    assert not t.is_held_out(t.parse("0 0 0"))


def test_held_out_fraction_is_about_one_in_sixteen():
    t = task("copy", n_symbols=10)
    every_input = [t.parse("".join(map(str, v))) for v in itertools.product(range(10), repeat=4)]
    assert len(every_input) == MIN_HOLDOUT_SPACE
    assert 560 <= sum(map(t.is_held_out, every_input)) <= 690  # 10_000 / 16 = 625


def test_add_mirror_images_share_a_partition():
    t = task("add", n_symbols=10, min_len=2, max_len=4)
    for src, _ in eval_set(t, 200, seed=0):
        a, b = add_operands(t, src)
        assert t.is_held_out(t.parse(f"{b}+{a}")) == t.is_held_out(src)


# --- text ---

@pytest.mark.parametrize("name, text, canonical", [
    ("copy", "3 1 4", "3 1 4"), ("copy", "314", "3 1 4"), ("copy", " 3  1\t4 ", "3 1 4"),
    ("copy", "\t314 ", "3 1 4"), ("add", "12+34", "1 2 + 3 4"), ("add", "12 + 34", "1 2 + 3 4"),
    ("add", "1 2 + 3 4", "1 2 + 3 4"), ("add", "12+3 4", "1 2 + 3 4"),
])
def test_parse_format_round_trip(name, text, canonical):
    t = task(name)
    assert t.format(t.parse(text)) == canonical
    assert t.format(t.parse(canonical)) == canonical


@pytest.mark.parametrize("name, text, word", [
    ("copy", "10 11", "10"), ("copy", "3 14", "14"), ("add", "10 11+1", "10"),
    ("add", "1+2 34", "34"),
])
def test_a_word_between_spaces_is_one_symbol(name, text, word):
    """"10 11" is not the digits 1 0 1 1: with one-character symbols '10' is unknown."""
    with pytest.raises(TaskInputError, match=f"'{word}' is not a symbol.*one symbol"):
        task(name).parse(text)


@pytest.mark.parametrize("name, text, output", [
    ("reverse", "314", "413"), ("reverse", "3 1 4", "4 1 3"), ("duplicate", "3", "3 3"),
    ("add", "12+34", "46"), ("add", "12 + 34", "46"), ("add", "5 + 7", "12"),
    ("add", "1 2 + 3 4", "4 6"), ("add", "99+1", "100"),
])
def test_outputs_are_written_as_the_input_is(name, text, output):
    t = task(name)
    assert t.format_like(t.target(t.parse(text)), text) == output


def test_multi_character_symbols_need_spaces():
    t = task("copy", n_symbols=12)
    assert t.format(t.parse("10 11 3")) == "10 11 3"
    with pytest.raises(TaskInputError, match="'1011'.*separated by spaces"):
        t.parse("1011")


@pytest.mark.parametrize("name, text, match", [
    ("copy", "3 x 4", r"'x' is not a symbol of task 'copy'.*0\.\.9"),
    ("copy", "3+4", "'\\+' is not a symbol"),
    ("copy", "1 2 <eos>", "'<eos>' is a special token"),
    ("copy", "<pad>", "'<pad>' is a special token"),
    ("copy", "", "empty input"),
    ("copy", "   ", "empty input"),
    ("reverse", "8 9", r"'9' is not a symbol of task 'reverse'.*0\.\.8"),  # n_symbols 9
    ("add", "1234", "has no '\\+'"),
    ("add", "1+2+3", "has 2 '\\+' signs"),
    ("add", "12+", "a number on each side"),
    ("add", "+", "a number on each side"),
    ("add", "1a+2", "'a' is not a symbol of task 'add'"),
])
def test_parse_errors_name_the_problem(name, text, match):
    with pytest.raises(TaskInputError, match=match):
        task(name, n_symbols=9 if name == "reverse" else 10).parse(text)


def test_parse_length_limit():
    t = task("copy")
    assert t.parse("1 2 3", max_tokens=3) == t.parse("123")
    with pytest.raises(TaskInputError, match="4 tokens.*3 allowed"):
        t.parse("1 2 3 4", max_tokens=3)


def test_add_errors_give_a_valid_example():
    t = task("add", n_symbols=2)
    example = t.example()[0].replace(" ", "")
    assert example == "101111+1010101"  # 47 + 85 in base 2
    with pytest.raises(TaskInputError) as err:
        t.parse("101")
    assert f"'{example}'" in str(err.value)
    assert t.format(t.target(t.parse(example))) == "1 0 0 0 0 1 0 0"  # 132


def test_format_strips_pad_bos_and_stops_at_eos():
    t = task("copy")
    ids = t.parse("3 1 4")
    assert t.format([BOS_ID] + ids + [EOS_ID] + ids + [PAD_ID]) == "3 1 4"
    assert t.format(ids + [PAD_ID, PAD_ID]) == "3 1 4"
    assert t.format(torch.tensor(ids)) == "3 1 4"


def symbols_of(t: Task):
    return st.sampled_from([str(v) for v in range(t.n_symbols)])


@pytest.mark.parametrize("n_symbols", [2, 10, 17])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_valid_token_lists_round_trip(n_symbols, data):
    t = task("sort", n_symbols=n_symbols)
    tokens = data.draw(st.lists(symbols_of(t), min_size=1, max_size=20))
    text = " ".join(tokens)
    assert t.format(t.parse(text)) == text
    if t.compact:
        assert t.format(t.parse("".join(tokens))) == text


@pytest.mark.parametrize("base", [2, 10])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_valid_sums_round_trip(base, data):
    t = task("add", n_symbols=base)
    digits = st.lists(symbols_of(t), min_size=1, max_size=8).map("".join)
    a, b = data.draw(digits), data.draw(digits)
    src = t.parse(f"{a}+{b}")
    assert t.format(src) == " ".join(f"{a}+{b}")
    assert int(t.format(t.target(src)).replace(" ", ""), base) == int(a, base) + int(b, base)


@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
@settings(max_examples=100, deadline=None)
@given(text=st.one_of(st.text(max_size=20),
                      st.text(alphabet="0123456789+ <>padboseq\t\n", max_size=20)))
def test_junk_parses_or_raises_task_input_error(name, text):
    t = task(name)
    try:
        ids = t.parse(text, max_tokens=12)
    except TaskInputError as err:
        assert "\n" not in str(err)  # one line for the CLI
        return
    assert 1 <= len(ids) <= 12
    plus = {t.vocab.id("+")} if "+" in t.vocab else set()
    assert all(t.first_data_id <= i < len(t.vocab) or i in plus for i in ids)
    assert t.parse(t.format(ids)) == ids


# --- batches ---

def test_make_batch_shapes_padding_bos_eos():
    t = task("duplicate")
    pairs = [(t.parse("1 2"), t.target(t.parse("1 2"))), (t.parse("3"), t.target(t.parse("3")))]
    batch = make_batch(pairs, t.vocab)
    assert batch.src.shape == (2, 2) and batch.tgt_in.shape == (2, 5)
    assert batch.tgt_out.shape == (2, 5) and batch.src.dtype == torch.long
    one, two, three = t.parse("123")
    assert batch.src.tolist() == [[one, two], [three, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, one, one, two, two],
                                     [BOS_ID, three, three, PAD_ID, PAD_ID]]
    assert batch.tgt_out.tolist() == [[one, one, two, two, EOS_ID],
                                      [three, three, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.n_target_tokens == 8 == int((batch.tgt_out != PAD_ID).sum())
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out) and moved.n_target_tokens == 8


def test_make_batch_with_empty_targets_and_no_pairs():
    t = task("copy")
    batch = make_batch([(t.parse("12"), [])], t.vocab)  # as prediction uses it
    assert batch.tgt_in.tolist() == [[BOS_ID]] and batch.tgt_out.tolist() == [[EOS_ID]]
    with pytest.raises(ValueError):
        make_batch([], t.vocab)
