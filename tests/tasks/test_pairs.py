"""Task pairs (issue #21): pairs read from files learn, split, resume, survive the files'
deletion, and every bad file is one line naming the file and the line, with nothing written."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from minitfm.app.api import train_run as train  # with TensorBoard and the attention recorder
from minitfm.catalog import TASKS
from minitfm.config import load_config
from minitfm.errors import CheckpointError, quote
from minitfm.run.checkpoint import load_checkpoint
from minitfm.tasks import make_task
from minitfm.tasks.pairfiles import MAX_PAIRS
from minitfm.tasks.pairs import UNK_ID, PairArray
from tests.helpers import assert_clean_error, run_cli

PAIRS = [
    "task.name=pairs", "model.d_model=32", "model.n_heads=2", "model.n_encoder_layers=1",
    "model.n_decoder_layers=1", "model.d_ff=64", "model.max_len=16", "train.batch_size=32",
    "train.warmup_steps=20", "train.eval_every=25", "train.eval_samples=200",
    "train.checkpoint_every=0", "log.log_every=5", "log.tensorboard=false",
    "log.attention_every=0",
]


def words(n: int, seed: int, letters: str = "abcdefghijklmnopqrstuvwxyz") -> list[str]:
    """`n` distinct random lowercase words of 2..6 letters."""
    rng, found = random.Random(seed), {}
    while len(found) < n:
        found[''.join(rng.choices(letters, k=rng.randint(2, 6)))] = None
    return list(found)


def write_tsv(path, pairs) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return str(path)


def upper(tmp_path, n: int = 50, seed: int = 0) -> list[str]:
    """Overrides for `n` pairs word -> WORD, evaluated on the training pairs themselves."""
    path = write_tsv(tmp_path / "upper.tsv", [(w, w.upper()) for w in words(n, seed)])
    return [*PAIRS, f"task.train_path={path}", f"task.eval_path={path}"]


def metrics(run_dir, split):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


# --- learning ---

@pytest.mark.slow  # trains until solved: past the fast half's ~50 steps
def test_fifty_uppercase_pairs_are_learned_in_a_few_hundred_steps(tmp_path):
    cfg = load_config(None, [*upper(tmp_path), "train.steps=400",
                             "train.target_exact_match=1.0"])
    summary = train(cfg, run_dir=tmp_path / "run")
    assert summary["exact_match"] == 1.0 and summary["step"] <= 400, summary
    assert metrics(tmp_path / "run", "eval")[-1]["samples"] == 50  # every training pair


# --- the held-out split ---

@pytest.fixture
def many(tmp_path):
    """3,000 distinct sources, then 300 of them again with other targets."""
    sources = words(3000, seed=1)
    pairs = [(w, w.upper()) for w in sources] + [(w, w[::-1]) for w in sources[:300]]
    return write_tsv(tmp_path / "many.tsv", pairs)


def pairs_task(path, *overrides):
    return make_task(load_config(None, [*PAIRS, f"task.train_path={path}", *overrides]).task)


def test_held_out_share_never_meets_training(many):
    task = pairs_task(many)
    held = {tuple(src) for src, _ in task.held_out}
    trained = {tuple(src) for src, _ in task.train}
    assert not held & trained
    assert len(task.held_out) + len(task.train) == 3300
    assert 0.07 < len(task.held_out) / 3300 < 0.13  # task.eval_fraction 0.1
    assert all(task.is_held_out(list(src)) for src in held)
    assert not any(task.is_held_out(list(src)) for src in trained)
    drawn = task.sample(2000, torch.Generator().manual_seed(0))
    assert not {tuple(src) for src, _ in drawn} & held


def test_held_out_share_is_stable_and_grows_with_the_fraction(many):
    first, again = pairs_task(many), pairs_task(many)
    assert first.held_out == again.held_out and first.train == again.train
    wider = pairs_task(many, "task.eval_fraction=0.3")
    small = {first.format(src) for src, _ in first.held_out}
    assert small < {wider.format(src) for src, _ in wider.held_out}


def test_eval_takes_the_first_pairs_in_file_order(many, tmp_path):
    held = write_tsv(tmp_path / "held.tsv", [("zz", "ZZ"), ("abc", "ABC"), ("q", "Q")])
    task = pairs_task(many, f"task.eval_path={held}")
    assert len(task.train) == 3300
    generator = torch.Generator().manual_seed(0)
    assert [task.format(s) for s, _ in task.sample(2, generator, split="eval")] == ["zz", "abc"]
    assert [task.format(s) for s, _ in task.sample(9, generator, split="eval", min_len=3)] == \
        ["abc"]


# --- tokenization and the vocabulary ---

def test_tokenize_space_makes_words_symbols_and_unseen_ones_unk(tmp_path):
    path = write_tsv(tmp_path / "w.tsv", [("the cat", "le chat"), ("the  dog", "le chien")])
    held = write_tsv(tmp_path / "h.tsv", [("the bird", "l' oiseau")])
    task = pairs_task(path, "task.tokenize=space", f"task.eval_path={held}")
    assert task.vocab.tokens[4:] == ("cat", "chat", "chien", "dog", "le", "the")
    assert task.format(task.parse("the  dog")) == "the dog"
    assert task.parse("the emu") == [task.vocab.id("the"), UNK_ID]
    assert task.unknown_symbols("the emu emu <eos>") == ["emu", "<eos>"]
    assert task.count_unknown(task.held_out) == 3  # bird, l', oiseau
    assert task.target(task.parse("the bird")) == task.held_out[0][1]
    assert task.target(task.parse("the cat")) == task.parse("le chat")
    assert task.target(task.parse("a cat")) is None


def test_tokenize_char_keeps_spaces_as_symbols(tmp_path):
    path = write_tsv(tmp_path / "c.tsv", [("ab", "a b")])
    task = pairs_task(path, f"task.eval_path={path}")
    assert " " in task.vocab and task.format(task.parse("b a")) == "b a"
    assert len(task.vocab) == TASKS["pairs"].vocab_size(task.n_symbols)  # the memory check's count


def test_task_max_len_selects_the_sources_trained_on(many):
    task = pairs_task(many, "task.min_len=3", "task.max_len=4")
    assert {len(src) for src, _ in task.train} == {3, 4}
    assert {len(src) for src, _ in task.held_out} == set(range(2, 7))  # all are kept
    assert load_config(None, [*PAIRS, f"task.train_path={many}"]).task.max_len == 16


# --- memory: pairs held as token arrays, counted before the files are read (M9) ---

def test_training_pairs_are_one_flat_array_of_two_byte_ids(many, tmp_path):
    task = pairs_task(many)
    assert isinstance(task.train, PairArray) and task.train.ids.itemsize == 2
    lines = [line.split("\t") for line in open(many, encoding="utf-8").read().splitlines()]
    trained = [(s, t) for s, t in lines if not task.is_held_out(task.parse(s))]
    assert [(task.format(s), task.format(t)) for s, t in task.train] == trained  # file order
    assert len(task.train.ids) == sum(len(s) + len(t) for s, t in trained)  # nothing else
    assert task.train.ids.itemsize * len(task.train.ids) < 3 * (tmp_path / "many.tsv").stat(
    ).st_size


def test_batches_are_drawn_as_from_lists(many):
    """The same generator draws pick the same pairs in the same order as a plain list would."""
    task = pairs_task(many, "task.min_len=3", "task.max_len=5")
    pool = [(list(s), list(t)) for s, t in task.train]
    assert all(3 <= len(s) <= 5 for s, _ in pool)
    picks = torch.randint(len(pool), (300,), generator=torch.Generator().manual_seed(7))
    drawn = task.sample(300, torch.Generator().manual_seed(7))
    assert drawn == [pool[i] for i in picks.tolist()]


def test_more_than_65536_tokens_take_four_bytes_an_id(tmp_path):
    path = tmp_path / "wide.tsv"
    path.write_bytes(new_symbols(7_000))  # 70,000 symbols
    task = pairs_task(path, f"task.eval_path={path}", "model.max_len=16")
    assert len(task.vocab) == 70_004 and task.train.ids.itemsize == 4
    last = path.read_text(encoding="utf-8").splitlines()[-1].split("\t")
    assert [task.format(side) for side in task.train[-1]] == last
    assert task.target(task.parse(last[0])) == task.parse(last[1])


def test_pair_array_reads_back_what_it_holds():
    pairs = [([4, 5], [6]), ([7], [70_000, 4]), ([4, 5], [9])]
    packed = PairArray.of(pairs, 70_001)
    assert list(packed) == pairs and packed[1:] == pairs[1:] and packed[-1] == pairs[-1]
    assert packed.find([4, 5]) == 0 and packed.find([5]) is None and packed.find([-1]) is None
    assert list(packed.lengths(0)) == [2, 1, 2] and list(packed.lengths(1)) == [1, 2, 1]
    with pytest.raises(IndexError):
        packed[3]


def test_the_memory_check_counts_the_data_and_names_the_file(tmp_path, monkeypatch):
    from minitfm.run import limits

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "big.tsv"
    with open(data, "wb") as f:
        f.truncate(10**7)  # sparse: refused before a byte is read
    overrides = [*PAIRS, f"task.train_path={data}"]
    parts = limits.training_parts(load_config(None, overrides))
    (key, value, size), others = parts[-1], sum(size for *_, size in parts[:-1])
    assert (key, value) == ("task.train_path", quote(str(data)))  # cut short if it is long
    assert size == limits.PAIRS_BYTES_PER_FILE_BYTE * (tmp_path / "big.tsv").stat().st_size
    monkeypatch.setattr(limits, "available_bytes", lambda: others + size // 2)
    result = run_cli("train", *overrides)
    check_refused(tmp_path, result, ["task.train_path ('", "big.tsv') needs ~",
                                     "available: use a part of the file"])


def test_an_escaped_pair_of_surrogates_is_one_character(tmp_path):
    path = tmp_path / "emoji.jsonl"
    path.write_text('{"source": "a\\ud83d\\ude00", "target": "b"}\n', encoding="utf-8")
    task = pairs_task(path, f"task.eval_path={path}")
    assert task.vocab.tokens[4:] == ("a", "b", "\U0001f600")


# --- checkpoints: resume, deletion of the files, hostile contents ---

def test_resume_is_bit_exact_on_pairs(tmp_path):
    cfg = load_config(None, [*upper(tmp_path), "model.dropout=0.1", "train.steps=40",
                             "log.log_every=1", "train.target_exact_match=null"])
    train(cfg, run_dir=tmp_path / "straight")
    first = train(cfg, run_dir=tmp_path / "split", stop_at=20)
    assert first["paused"] and first["step"] == 20
    train(None, resume=tmp_path / "split" / "checkpoints" / "last.pt")
    straight = [r["loss"] for r in metrics(tmp_path / "straight", "train")]
    resumed = [r["loss"] for r in metrics(tmp_path / "split", "train")]
    assert len(straight) == len(resumed) == 40 and straight == resumed


def write_upper(root, n_train: int = 50):
    """train.tsv (`n_train` pairs word -> WORD of letters a..h) and eval.tsv (10 more, and
    ab-c -> AB-C, whose '-' no training pair has) in `root`; the two overrides."""
    pairs = [(w, w.upper()) for w in words(60, seed=2, letters="abcdefgh")]
    train_path = write_tsv(root / "train.tsv", pairs[:n_train])
    eval_path = write_tsv(root / "eval.tsv", pairs[50:] + [("ab-c", "AB-C")])
    return [f"task.train_path={train_path}", f"task.eval_path={eval_path}"]


@pytest.fixture(scope="module")
def gone(tmp_path_factory):
    """A pairs run (30 steps, TensorBoard on) whose data files were deleted afterwards."""
    root = tmp_path_factory.mktemp("gone")
    result = run_cli("train", *PAIRS, *write_upper(root), "train.steps=30",
                     "train.eval_every=10", "log.tensorboard=true", "log.attention_every=10",
                     "--run-dir", root / "run")
    assert result.exit_code == 0, result.stderr
    assert "50 training pairs, 11 held out" in result.stdout
    (root / "train.tsv").unlink()
    (root / "eval.tsv").unlink()
    return root / "run"


def test_eval_after_the_files_are_deleted(gone):
    result = run_cli("eval", gone, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["samples"] == 11 and report["task"] == "pairs"
    assert report["unknown_symbols"] == 2  # '-' in ab-c and in AB-C
    assert sum(row["count"] for row in report["per_length"].values()) == 11
    assert run_cli("eval", gone).exit_code == 0
    assert_clean_error(run_cli("eval", gone, "--min-len", "9"), 2, "held-out", "9..16")


def test_predict_after_the_files_are_deleted(gone):
    result = run_cli("predict", gone, "--json", "hhhhhhh", "ab-c")
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[0]["expected"] is None and rows[0]["match"] is None and "unknown" not in rows[0]
    assert rows[1]["expected"] == "AB<unk>C" and rows[1]["unknown"] == ["-"]
    assert "note: input 2: '-' never seen in training, read as <unk>" in result.stderr
    assert_clean_error(run_cli("predict", gone, ""), 2, "empty input")


def test_attention_over_training_without_an_ideal_alignment(gone, tmp_path):
    recorded = [json.loads(line) for line in (gone / "attention.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recorded] == [10, 20, 30]
    assert all(r["alignment"] is None and len(r["entropy"]) == 1 for r in recorded)
    events = EventAccumulator(str(gone), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("6_entropy/layer0/head1")] == [10, 20, 30]
    result = run_cli("visualize-attention", gone, "--over-training", "--out", tmp_path / "s.png")
    assert result.exit_code == 0, result.stderr
    assert "layer 0, the last: the task has no ideal alignment" in result.stdout
    assert (tmp_path / "s.png").stat().st_size > 0


def test_visualize_attention_after_the_files_are_deleted(gone, tmp_path):
    result = run_cli("visualize-attention", gone, "--out", tmp_path / "a.png", "--kind", "cross")
    assert result.exit_code == 0, result.stderr
    assert "no ideal alignment" in result.stdout and (tmp_path / "a.png").stat().st_size > 0
    other = run_cli("visualize-attention", gone, "--input", "hello", "--no-terminal",
                    "--out", tmp_path / "b.png")
    assert other.exit_code == 0 and "expected:   (unknown" in other.stdout


def test_tensorboard_of_a_pairs_run(gone):
    events = EventAccumulator(str(gone), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("2_accuracy/exact_match")] == [10, 20, 30]
    assert "3_attention/cross/layer0/head0" in events.Tags()["images"]
    assert not [tag for tag in events.Tags()["scalars"] if "alignment/" in tag]


def test_resume_needs_the_files_and_the_same_data(tmp_path):
    data = write_upper(tmp_path)
    assert run_cli("train", *PAIRS, *data, "train.steps=10", "--run-dir",
                   tmp_path / "run").exit_code == 0
    (tmp_path / "train.tsv").unlink()
    assert_clean_error(run_cli("train", "--resume", tmp_path / "run", "train.steps=12"), 2,
                       "task.train_path", "train.tsv", "not found")
    write_upper(tmp_path)  # the same files again
    result = run_cli("train", "--resume", tmp_path / "run", "train.steps=12")
    assert result.exit_code == 0, result.stderr
    write_upper(tmp_path, n_train=49)
    assert_clean_error(run_cli("train", "--resume", tmp_path / "run", "train.steps=14"), 2,
                       "trained on other data")
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 12


@pytest.mark.slow  # a sweep starts other torch processes
def test_a_sweep_of_a_pairs_config(tmp_path):
    write_upper(tmp_path)
    config = tmp_path / "upper.yaml"  # relative paths: from the config's folder in every job
    config.write_text("task:\n  name: pairs\n  train_path: train.tsv\n  eval_path: eval.tsv\n")
    result = run_cli("sweep", config, *PAIRS, "train.steps=10", "--seeds", "0,1", "--out",
                     tmp_path / "sw", "--eval-samples", "50", "--eval-lengths", "2..6")
    assert result.exit_code == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in (tmp_path / "sw" / "results.jsonl").open()]
    assert [row["status"] for row in rows] == ["finished", "finished"]
    assert all(set(row["exact_match"]) == {"1..16", "2..6"} for row in rows)
    assert all(set(map(int, row["per_length"])) <= set(range(2, 7)) for row in rows)


@pytest.mark.parametrize("change,needle", [
    (lambda s: s["pairs"].update(held_out=[[1, "a"]]), "pairs.held_out"),
    (lambda s: s["pairs"].update(held_out=[]), "pairs.held_out"),
    (lambda s: s["pairs"].update(longest=[0, 5]), "pairs.longest"),
    (lambda s: s.pop("pairs"), "'pairs' must be a mapping"),
    (lambda s: s["vocab"].__setitem__(3, "x"), "starts with"),
    (lambda s: s["vocab"].append("y" * 1001), "'vocab' must be a list"),
])
def test_hostile_pairs_data_in_a_checkpoint_is_refused(gone, tmp_path, change, needle):
    state = torch.load(gone / "checkpoints" / "last.pt", weights_only=True)
    change(state)
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=needle):
        load_checkpoint(tmp_path / "bad.pt")
    assert_clean_error(run_cli("eval", tmp_path / "bad.pt"), 2, "bad.pt")


# --- config: paths and per-task keys ---

def test_paths_resolve_against_the_config_folder_and_are_stored_absolute(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "c.yaml").write_text(
        "task:\n  name: pairs\n  train_path: ../data/train.tsv\n")
    monkeypatch.chdir(tmp_path / "configs")
    cfg = load_config("c.yaml", ["task.eval_path=e.jsonl"])
    assert cfg.task.train_path == str((tmp_path / "data" / "train.tsv").resolve())
    assert cfg.task.eval_path == str((tmp_path / "configs" / "e.jsonl").resolve())  # the cwd
    result = run_cli("train", "--print-config", "c.yaml")
    assert yaml.safe_load(result.stdout)["task"]["train_path"] == cfg.task.train_path


@pytest.mark.parametrize("overrides,needle", [
    (["task.name=pairs"], "needs task.train_path"),
    (["task.train_path=a.tsv"], "applies only to task 'pairs'"),
    (["task.tokenize=space"], "applies only to task 'pairs'"),
    (["task.name=pairs", "task.train_path=a.csv"], "must end in .tsv"),
    (["task.name=pairs", "task.train_path=a.tsv", "task.n_symbols=5"], "does not apply"),
    (["task.name=pairs", "task.train_path=a.tsv", "task.eval_path=b.tsv",
      "task.eval_fraction=0.5"], "only without task.eval_path"),
    (["task.name=pairs", "task.train_path=a.tsv", "task.tokenize=words"], "task.tokenize"),
])
def test_pairs_keys_are_checked_with_the_config(tmp_path, monkeypatch, overrides, needle):
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("train", *overrides), 2, needle)
    assert list(tmp_path.iterdir()) == []


def test_tasks_lists_pairs():
    result = run_cli("tasks")
    assert result.exit_code == 0 and "pairs" in result.stdout and "2026-11-22" in result.stdout


# --- bad files: one line naming the file and the line, exit 2, nothing written ---

def new_symbols(n_lines: int) -> bytes:
    """`n_lines` pairs, each source 10 characters no other line has (target: its first)."""
    chars = [chr(0x10000 + i) for i in range(10 * n_lines)]
    sources = ["".join(chars[i:i + 10]) for i in range(0, len(chars), 10)]
    return "".join(f"{source}\t{source[0]}\n" for source in sources).encode()


TSV_OK = b"ab\tAB\ncd\tCD\n"
BAD_FILES = [  # (file name, content, extra overrides, what the error says)
    ("gone.tsv", None, [], ["gone.tsv", "not found"]),
    ("empty.tsv", b"", [], ["empty.tsv", "has no pairs"]),
    ("blank.tsv", b"\n\n", [], ["blank.tsv", "has no pairs"]),
    ("notab.tsv", TSV_OK + b"ef EF\n", [], ["notab.tsv' line 3", "no tab"]),
    ("tabs.tsv", b"a\tb\tc\n", [], ["tabs.tsv' line 1", "2 tabs"]),
    ("nosrc.tsv", TSV_OK + b"\tEF\n", [], ["nosrc.tsv' line 3", "empty source"]),
    ("notgt.tsv", b"ab\t\n", [], ["notgt.tsv' line 1", "empty target"]),
    ("spaces.tsv", b"ab\tAB\n  \tX\n", ["task.tokenize=space"], ["line 2", "empty source"]),
    ("bad.jsonl", b'{"source": "a", "target": "A"}\n{"source": "b",\n', [],
     ["bad.jsonl' line 2", "invalid JSON"]),
    ("notgt.jsonl", b'{"source": "a"}\n', [], ["notgt.jsonl' line 1", "no 'target' key"]),
    ("nosrc.jsonl", b'{"target": "a"}\n', [], ["line 1", "no 'source' key"]),
    ("list.jsonl", b'["a", "A"]\n', [], ["list.jsonl' line 1", "an object"]),
    ("int.jsonl", b'{"source": 12, "target": "A"}\n', [], ["line 1", "must be a string"]),
    ("latin1.tsv", TSV_OK + b"caf\xe9\tCAF\xc9\n", [], ["latin1.tsv' line 3", "not UTF-8",
                                                        "0xe9"]),
    ("long.tsv", TSV_OK + b"a" * 20 + b"\tb\n", [],
     ["long.tsv' line 3", "needs 20 positions", "model.max_len (16)"]),
    ("longtgt.tsv", b"a\t" + b"b" * 16 + b"\n", [], ["line 1", "needs 17 positions"]),
    ("reserved.tsv", b"a <eos>\tb\n", ["task.tokenize=space"], ["line 1", "'<eos>'",
                                                                  "reserved"]),
    ("hugeline.tsv", b"a" * 1_000_001 + b"\tb\n", [], ["hugeline.tsv' line 1", "1,000,000 bytes"]),
    ("tiny.tsv", b"ab\tAB\n", ["task.eval_path=null"], ["tiny.tsv", "holds out no pair"]),
    ("symbols.tsv", new_symbols(10_001), [],
     ["symbols.tsv' line 10,001", "more than 100,000 distinct symbols"]),
    ("word.tsv", b"a" * 1001 + b" b\tc\n", ["task.tokenize=space"],
     ["word.tsv' line 1", "1,001 characters"]),
    ("half.jsonl", b'{"source": "ab", "target": "AB"}\n{"source": "x\\ud800y", "target": "z"}\n',
     [], ["half.jsonl' line 2", "'source' holds an unpaired surrogate (\\ud800) at character 2"]),
    ("low.jsonl", b'{"source": "ab", "target": "\\udc00"}\n', [],
     ["low.jsonl' line 1", "'target' holds an unpaired surrogate (\\udc00)"]),
]


def check_refused(tmp_path, result, needles) -> None:
    assert_clean_error(result, 2, *needles)
    assert not (tmp_path / "runs").exists()  # nothing written: no run directory


@pytest.mark.parametrize("name,content,extra,needles", BAD_FILES, ids=lambda v: str(v)[:20])
def test_bad_training_file(tmp_path, monkeypatch, name, content, extra, needles):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        (tmp_path / name).write_bytes(content)
    write_tsv(tmp_path / "eval.tsv", [("ab", "AB")])
    overrides = [f"task.train_path={name}", "task.eval_path=eval.tsv", *extra]
    check_refused(tmp_path, run_cli("train", *PAIRS, *overrides), needles)


@pytest.mark.parametrize("content,needles", [
    (b"", ["task.eval_path", "held.tsv", "has no pairs"]),
    (b"ab\tAB\nxy\n", ["task.eval_path", "held.tsv' line 2", "no tab"]),
    (b"ab\t" + b"B" * 30 + b"\n", ["task.eval_path", "held.tsv' line 1", "needs 31 positions"]),
])
def test_bad_eval_file(tmp_path, monkeypatch, content, needles):
    monkeypatch.chdir(tmp_path)
    write_tsv(tmp_path / "train.tsv", [("ab", "AB")])
    (tmp_path / "held.tsv").write_bytes(content)
    result = run_cli("train", *PAIRS, "task.train_path=train.tsv", "task.eval_path=held.tsv")
    check_refused(tmp_path, result, needles)


def test_a_directory_is_no_data_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.tsv").mkdir()
    check_refused(tmp_path, run_cli("train", *PAIRS, "task.train_path=dir.tsv"),
                  ["dir.tsv", "not a regular file"])


@pytest.mark.slow  # writes and reads a 1,000,001-line file
def test_more_than_a_million_pairs_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.tsv").write_bytes(b"a\tb\n" * (MAX_PAIRS + 1))
    check_refused(tmp_path, run_cli("train", *PAIRS, "task.train_path=big.tsv"),
                  ["big.tsv' line 1,000,001", "more than 1,000,000 pairs"])


def test_a_file_over_a_gigabyte_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "huge.tsv", "wb") as f:
        f.truncate(10**9 + 1)  # sparse: no disk space, nothing to read
    check_refused(tmp_path, run_cli("train", *PAIRS, "task.train_path=huge.tsv"),
                  ["huge.tsv", "1,000,000,001 bytes", "1 GB"])


def test_missing_example_data_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "make_data.py").write_text("")
    check_refused(tmp_path, run_cli("train", *PAIRS, "task.train_path=train.tsv"),
                  ["train.tsv", "not found", "make it with python make_data.py"])
