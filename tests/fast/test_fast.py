"""The speed appendix against the book: each kernel equal to the readable form it replaces
(values and gradients, in float64), the fast model equal to the book's (same parameters, same
state_dict, same logits and gradients, packed or not), and the switch `model.code` that picks
which of the two runs."""

import math

import pytest
import torch
import yaml

import minitfm.book.attention as book_attention
from minitfm.book.attention import AttentionScope, MultiHeadAttention, attention
from minitfm.book.layers import Dropout, LayerNorm
from minitfm.book.model import Seq2SeqTransformer, sequence_loss
from minitfm.config import ModelConfig, load_config
from minitfm.fast.kernels import (
    AttentionFunction,
    LayerNormFunction,
    scaled_dot_product_attention,
)
from minitfm.fast.model import (
    FastLayerNorm,
    FastMultiHeadAttention,
    FastTransformer,
    build_model,
)
from minitfm.lab.loaded import load
from minitfm.run.checkpoint import load_checkpoint
from minitfm.tasks import make_task
from tests.book.helpers import DTYPE, assert_all_close, causal, grads, leaf
from tests.book.test_model import BOS, EOS, PAD, VOCAB, padded, symbols
from tests.book.test_positional import IDS, SETTINGS
from tests.helpers import TINY, run_cli


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# The kernels against the book's readable forms


def test_layer_norm_function_equals_the_books_layer_norm():
    norm = LayerNorm(6).to(DTYPE)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6, dtype=DTYPE))
        norm.bias.copy_(torch.randn(6, dtype=DTYPE))
    x = (torch.randn(2, 3, 6, dtype=DTYPE) * 3 + 1).requires_grad_()
    ours = LayerNormFunction.apply(x, norm.weight, norm.bias, norm.eps)
    book = norm(x)
    torch.testing.assert_close(ours, book, rtol=0, atol=1e-12)
    params = (x, norm.weight, norm.bias)
    assert_all_close(grads(ours, params), grads(book, params), atol=1e-12)


def test_layer_norm_backward_passes_gradcheck():
    x, weight, bias = leaf(2, 3, 6), leaf(6), leaf(6)
    assert torch.autograd.gradcheck(lambda *a: LayerNormFunction.apply(*a, 1e-5), (x, weight, bias))


@pytest.mark.parametrize("case", ["plain", "padding", "causal", "bias", "cross"])
def test_the_attention_kernel_equals_the_books_attention(case):
    B, H, T_q, T_k, K = 3, 2, 5, 7 if case == "cross" else 5, 4
    q, k, v = leaf(B, H, T_q, K), leaf(B, H, T_k, K), leaf(B, H, T_k, K)
    mask = bias = None
    if case == "causal":
        mask = causal(T_q)
    if case in ("padding", "cross"):
        lengths = torch.tensor([T_k, 3, 1])
        mask = (torch.arange(T_k)[None, :] < lengths[:, None])[:, None, None, :]
    if case == "bias":
        bias = torch.randn(H, T_q, T_k, dtype=DTYPE)
    kernel, kernel_weights = scaled_dot_product_attention(q, k, v, mask, bias)
    book, book_weights = attention(q, k, v, mask, bias)
    torch.testing.assert_close(kernel, book, rtol=0, atol=1e-12)
    torch.testing.assert_close(kernel_weights, book_weights, rtol=0, atol=1e-12)
    assert_all_close(grads(kernel, (q, k, v)), grads(book, (q, k, v)), atol=1e-12)


def test_the_attention_kernel_draws_dropout_as_the_book_does():
    q, k, v = leaf(2, 2, 4, 4), leaf(2, 2, 4, 4), leaf(2, 2, 4, 4)
    dropout = Dropout(0.5).train()
    torch.manual_seed(7)
    book, book_weights = attention(q, k, v, dropout=dropout)
    torch.manual_seed(7)
    keep = dropout.scale((2, 2, 4, 4), q)  # the same uniform draws, over the weights' shape
    kernel, kernel_weights = scaled_dot_product_attention(q, k, v, keep=keep)
    torch.testing.assert_close(kernel, book, rtol=0, atol=1e-12)
    torch.testing.assert_close(kernel_weights, book_weights, rtol=0, atol=1e-12)
    assert_all_close(grads(kernel, (q, k, v)), grads(book, (q, k, v)), atol=1e-12)


def autograd_attention(q, k, v, additive, keep):
    """The forward of AttentionFunction in plain ops, for autograd to differentiate."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + additive
    weights = scores.softmax(dim=-1)
    return (weights * keep) @ v


@pytest.mark.parametrize("case", ["plain", "mask+bias", "dropout", "cross"])
def test_attention_backward_passes_gradcheck(case):
    B, H, T_q, T_k, K = 2, 2, 3, 4 if case == "cross" else 3, 4
    q, k, v = leaf(B, H, T_q, K), leaf(B, H, T_k, K), leaf(B, H, T_k, K)
    additive = keep = None
    if case == "mask+bias":  # a causal mask (lowest value where masked) plus an ALiBi-like bias
        additive = torch.zeros(T_q, T_k, dtype=DTYPE).masked_fill(~causal(T_q), -1e9)
        additive = additive + torch.randn(H, T_q, T_k, dtype=DTYPE)
    if case == "dropout":
        keep = Dropout(0.4).train().scale((B, H, T_q, T_k), q)
    assert torch.autograd.gradcheck(AttentionFunction.apply, (q, k, v, additive, keep))


@pytest.mark.parametrize("case", ["mask+bias", "dropout"])
def test_attention_backward_matches_autograd(case):
    B, H, T, K = 3, 2, 5, 4
    q, k, v = leaf(B, H, T, K), leaf(B, H, T, K), leaf(B, H, T, K)
    additive = torch.zeros(T, T, dtype=DTYPE).masked_fill(~causal(T), torch.finfo(DTYPE).min)
    additive = additive + (torch.randn(H, T, T, dtype=DTYPE) if case == "mask+bias" else 0)
    keep = torch.ones(B, H, T, T, dtype=DTYPE)
    if case == "dropout":
        keep = Dropout(0.3).train().scale(keep.shape, q)
    ours, weights = AttentionFunction.apply(q, k, v, additive, keep)
    ref = autograd_attention(q, k, v, additive, keep)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    assert_all_close(grads(ours, (q, k, v)), grads(ref, (q, k, v)), atol=1e-12)
    assert not weights.requires_grad  # returned for inspection only


# The fast model against the book's


def model_pair(positional="sinusoidal", random_positions=None, **overrides):
    """The book's model and the fast one from the same seed, in float64."""
    settings = dict(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32,
                    max_len=40, positional=positional, random_positions=random_positions)
    cfg = ModelConfig(**(settings | overrides))
    models = []
    for kind in (Seq2SeqTransformer, FastTransformer):
        torch.manual_seed(0)
        models.append(kind(cfg, VOCAB, PAD).to(DTYPE))
    return models


def test_the_fast_model_has_the_books_parameters_and_state_dict():
    book, fast = model_pair()
    assert list(book.state_dict()) == list(fast.state_dict())
    for (name, a), b in zip(book.state_dict().items(), fast.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    kinds = [type(m) for m in fast.modules()]
    assert MultiHeadAttention not in kinds and LayerNorm not in kinds  # every one replaced
    assert kinds.count(FastMultiHeadAttention) == 2 + 2 * 2  # encoder self; decoder self, cross
    assert kinds.count(FastLayerNorm) == 2 * 2 + 2 * 3 + 2  # two, three a layer; the final two
    assert all(isinstance(m, Seq2SeqTransformer) for m in (book, fast))
    fast.load_state_dict(book.state_dict())  # a checkpoint of either loads into the other
    book.load_state_dict(fast.state_dict())


def test_installed_kernels_keep_the_parameters_themselves_and_the_hooks():
    torch.manual_seed(0)
    book = Seq2SeqTransformer(ModelConfig(d_model=16, n_heads=2, d_ff=32), VOCAB, PAD)
    attention_module = book.decoder_layers[0].cross_attn
    calls = []
    attention_module.heads.register_forward_hook(lambda *_: calls.append(1))
    q_weight = attention_module.q_proj.weight
    from minitfm.fast.model import install_kernels
    install_kernels(book)
    installed = book.decoder_layers[0].cross_attn
    assert isinstance(installed, FastMultiHeadAttention) and installed.q_proj.weight is q_weight
    book.eval()(symbols(2, 4), symbols(2, 3, seed=2))
    assert calls == [1]  # the hook point on the heads is the same module


@pytest.mark.parametrize("positional, limit", SETTINGS, ids=IDS)
@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-LN", "post-LN"])
def test_the_fast_model_trains_as_the_book_does(positional, limit, norm_first):
    """In training the fast model packs the real tokens and runs the kernels: the logits at real
    positions, the loss and every gradient are the book's (randomized positions drawn alike)."""
    src = padded([[3, 4, 5, 6, 7], [8, 9], [10, 3, 4]])
    tgt_in = padded([[BOS, 7, 6, 5, 4, 3], [BOS, 9, 8], [BOS, 4]])
    tgt_out = padded([[7, 6, 5, 4, 3, EOS], [9, 8, EOS], [4, EOS]])
    real = tgt_out != PAD
    results = []
    for model in model_pair(positional, limit, norm_first=norm_first):
        torch.manual_seed(7)  # the same random positions
        logits = model.train()(src, tgt_in)
        loss = sequence_loss(logits, tgt_out, PAD)
        loss.backward()
        results.append((logits[real], loss, [p.grad for p in model.parameters()]))
    (book, book_loss, book_grads), (fast, fast_loss, fast_grads) = results
    torch.testing.assert_close(fast, book, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast_loss, book_loss, rtol=0, atol=1e-12)
    assert_all_close(fast_grads, book_grads, atol=1e-12)


def test_the_fast_model_evaluates_as_the_book_does():
    book, fast = model_pair(positional="rope")
    src, tgt = padded([[3, 4, 5, 6, 7], [8, 9]]), symbols(2, 4, seed=2)
    logits, maps = book.eval()(src, tgt, return_attention=True)
    fast_logits, fast_maps = fast.eval()(src, tgt, return_attention=True)
    torch.testing.assert_close(fast_logits, logits, rtol=0, atol=1e-12)
    for a, b in zip(maps.cross + maps.encoder, fast_maps.cross + fast_maps.encoder, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)


def test_the_fast_model_draws_dropout_as_the_book_does():
    """Without padding nothing is packed, so the dropout draws are the book's, one for one (a
    packed batch draws masks over its real tokens only: other draws, the same distribution)."""
    book, fast = model_pair(dropout=0.3)
    src, tgt = symbols(2, 5), symbols(2, 4, seed=2)
    torch.manual_seed(11)
    expected = book.train()(src, tgt)
    torch.manual_seed(11)
    torch.testing.assert_close(fast.train()(src, tgt), expected, rtol=0, atol=1e-12)


# The switch


def test_model_code_picks_the_code_and_keeps_the_weights():
    task = make_task(load_config().task)
    models = {}
    for code in ("fast", "book"):
        torch.manual_seed(0)
        models[code] = build_model(load_config(None, [f"model.code={code}"]), task)
    assert type(models["fast"]) is FastTransformer
    assert type(models["book"]) is Seq2SeqTransformer
    for a, b in zip(models["fast"].state_dict().values(), models["book"].state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


def test_the_book_model_runs_the_books_attention_and_the_fast_one_does_not(monkeypatch):
    """Replace the book's `attention()`: a model built with model.code=book changes its output,
    one built with model.code=fast does not (it runs the appendix's kernel)."""
    book, fast = model_pair()
    src, tgt = padded([[3, 4, 5], [8, 9, 10, 6]]), symbols(2, 4, seed=2)
    before = {"book": book.eval()(src, tgt), "fast": fast.eval()(src, tgt)}

    def uniform_attention(q, k, v, mask=None, bias=None, dropout=None):
        weights = torch.full((*q.shape[:-1], k.size(-2)), 1 / k.size(-2), dtype=q.dtype)
        return weights @ v, weights

    monkeypatch.setattr(book_attention, "attention", uniform_attention)
    assert not torch.allclose(book(src, tgt), before["book"])
    assert torch.equal(fast(src, tgt), before["fast"])


def test_the_book_model_runs_the_books_layer_norm(monkeypatch):
    book, fast = model_pair()
    src, tgt = padded([[3, 4, 5]]), symbols(1, 4, seed=2)
    before = {"book": book.eval()(src, tgt), "fast": fast.eval()(src, tgt)}
    monkeypatch.setattr(LayerNorm, "forward", lambda self, x: x)
    assert not torch.allclose(book(src, tgt), before["book"])
    assert torch.equal(fast(src, tgt), before["fast"])


def test_the_fast_attention_module_takes_the_books_scope():
    """A plain AttentionScope (no packing) is what the book hands in outside training."""
    torch.manual_seed(0)
    book = MultiHeadAttention(8, 2).to(DTYPE)
    from minitfm.fast.model import adopt
    torch.manual_seed(0)
    fast = adopt(MultiHeadAttention(8, 2).to(DTYPE), FastMultiHeadAttention)
    x = leaf(2, 5, 8)
    scope = AttentionScope(causal(5))
    torch.testing.assert_close(fast(x, x, x, scope)[0], book(x, x, x, scope)[0], rtol=0,
                               atol=1e-12)


def test_a_run_of_the_books_code_says_so_and_records_it(tmp_path):
    """model.code is printed in the run's header and kept in config.yaml and the checkpoints;
    the run's checkpoint then loads into either code."""
    run_dir = tmp_path / "run"
    result = run_cli("train", *TINY, "train.steps=4", "model.code=book", "--run-dir", run_dir)
    assert result.exit_code == 0, result.stderr
    assert ", code book, device " in result.stdout
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["code"] == "book"
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["config"]["model"]["code"] == "book"
    assert type(load(run_dir).model) is Seq2SeqTransformer
    assert run_cli("eval", run_dir, "--samples", "20").exit_code == 0
    default = run_cli("train", *TINY, "train.steps=2", "--run-dir", tmp_path / "default")
    assert ", code fast, device " in default.stdout
