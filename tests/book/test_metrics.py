"""Chapter 7, honest metrics: exact match and token accuracy by hand, greedy decoding in
length chunks, and evaluation that never lets decoding see the target."""

import pytest
import torch

from minitfm.book.metrics import evaluate, length_chunks, predict, score, strip_eos
from minitfm.book.model import Seq2SeqTransformer
from minitfm.config import load_config
from minitfm.tasks import make_task
from minitfm.tasks.base import eval_set


def test_exact_match_and_token_accuracy_by_hand():
    pairs = [([5], [5, 6, 7]), ([5], [5, 6]), ([5, 6], [7, 8]), ([5, 6], [7])]
    predictions = [[5, 6, 7], [5, 6, 7], [7], [8, 7]]
    total, per_length = score(pairs, predictions)
    # right; one extra token (2 of 3); one missing token (1 of 2); wrong + extra (0 of 2)
    assert total.exact_match == 0.25
    assert total.token_accuracy == pytest.approx((3 + 2 + 1 + 0) / (3 + 3 + 2 + 2))
    assert per_length[1].count == 2 and per_length[1].exact_match == 0.5
    assert per_length[2].token_accuracy == pytest.approx(1 / 4)


def test_strip_eos():
    assert strip_eos([4, 5, 2, 0, 0], eos_id=2) == [4, 5]
    assert strip_eos([4, 5, 6], eos_id=2) == [4, 5, 6]


def test_length_chunks_group_similar_lengths():
    assert length_chunks([3, 1, 2, 1, 3], 2) == [[1, 3], [2, 0], [4]]
    assert length_chunks([], 4) == []


def tiny_model():
    cfg = load_config(None, ["task.name=copy", "task.max_len=5", "model.d_model=16",
                             "model.n_heads=2", "model.d_ff=32"])
    task = make_task(cfg.task)
    torch.manual_seed(0)
    return Seq2SeqTransformer(cfg.model, len(task.vocab), task.vocab.pad_id), task


def test_evaluation_decodes_what_predict_decodes():
    """The exact match of `evaluate` is that of `predict`'s outputs against the targets."""
    model, task = tiny_model()
    pairs = eval_set(task, 40, 0)
    result = evaluate(model, task, pairs, "cpu", batch_size=7)
    assert predict(model, task, [src for src, _ in pairs], "cpu", 7) == result.predictions
    right = sum(pred == target for pred, (_, target) in zip(result.predictions, pairs))
    assert result.exact_match == right / len(pairs)
    assert result.total.count == 40 and result.loss > 0


def test_evaluation_never_feeds_the_target_to_decoding():
    """Changing every target changes the exact match and the loss, never the predictions."""
    model, task = tiny_model()
    pairs = eval_set(task, 20, 0)
    wrong = [(src, [(t + 1) % 10 + 3 for t in target]) for src, target in pairs]
    a, b = evaluate(model, task, pairs, "cpu"), evaluate(model, task, wrong, "cpu")
    assert a.predictions == b.predictions and a.loss != b.loss


def test_an_answer_does_not_depend_on_what_else_is_decoded_with_it():
    """An untrained model seldom writes EOS, so its rows run to their caps: each input's answer
    is cut at its own cap, in any batch size and order (the chunk's cap once leaked into it)."""
    model, task = tiny_model()
    sources = [src for src, _ in eval_set(task, 40, 0)]
    alone = [predict(model, task, [src], "cpu")[0] for src in sources]
    generator = torch.Generator().manual_seed(0)
    for batch_size in (1, 3, 7, 40):
        order = torch.randperm(len(sources), generator=generator).tolist()
        shuffled = predict(model, task, [sources[i] for i in order], "cpu", batch_size)
        assert [shuffled[order.index(i)] for i in range(len(sources))] == alone
    assert any(len(answer) == task.max_target_len(len(src)) + 1
               for answer, src in zip(alone, sources))  # some rows did run to their caps
