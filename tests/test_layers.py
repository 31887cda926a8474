"""The hand-written primitives against PyTorch's own (values and gradients, in float64)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitfm.book.attention import (
    AttentionScope,
    KVCache,
    MultiHeadAttention,
    attention,
    scaled_dot_product_attention,
)
from minitfm.book.layers import Dropout, FeedForward, LayerNorm
from minitfm.book.positions import (
    ALiBiPositions,
    LearnedPositions,
    NoPositions,
    RotaryPositions,
    SinusoidalPositions,
    make_positional,
)
from minitfm.fast.kernels import AttentionFunction, LayerNormFunction
from tests.helpers import assert_clean_error, run_cli

DTYPE = torch.float64


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def leaf(*shape):
    return torch.randn(*shape, dtype=DTYPE, requires_grad=True)


def grads(output, inputs, seed=1):
    """Gradients of a fixed random projection of `output` with respect to `inputs`."""
    g = torch.randn(output.shape, dtype=output.dtype, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(output, inputs, g)


def assert_all_close(actual, expected, atol=1e-10):
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=atol)


def causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


# Layer norm


@pytest.mark.parametrize("shape", [(8,), (4, 8), (3, 5, 8)])
def test_layer_norm_matches_reference(shape):
    norm = LayerNorm(8).to(DTYPE)
    with torch.no_grad():  # non-trivial γ and δ, so their gradients are checked too
        norm.weight.copy_(torch.randn(8, dtype=DTYPE))
        norm.bias.copy_(torch.randn(8, dtype=DTYPE))
    x = (torch.randn(shape, dtype=DTYPE) * 3 + 1).requires_grad_()
    ours = norm(x)
    ref = F.layer_norm(x, (8,), norm.weight, norm.bias, eps=1e-5)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    params = (x, norm.weight, norm.bias)
    assert_all_close(grads(ours, params), grads(ref, params), atol=1e-12)


def test_layer_norm_backward_passes_gradcheck():
    x, weight, bias = leaf(2, 3, 6), leaf(6), leaf(6)
    assert torch.autograd.gradcheck(lambda *a: LayerNormFunction.apply(*a, 1e-5), (x, weight, bias))


def test_layer_norm_normalises_with_biased_variance():
    y = LayerNorm(16)(torch.randn(4, 16) * 5 + 3)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(4), atol=1e-3, rtol=0)


# Scaled dot-product attention


@pytest.mark.parametrize("kind", ["random", "causal"])
def test_attention_matches_reference(kind):
    B, H, T_q, T_k, K = 2, 3, 5, 5, 4
    q, k, v = leaf(B, H, T_q, K), leaf(B, H, T_k, K), leaf(B, H, T_k, K)
    if kind == "causal":
        mask = causal(T_q)  # (T, T), broadcast over B and H
    else:
        mask = torch.rand(B, 1, T_q, T_k) < 0.6
        mask[..., 0] = True  # every row keeps a key, as in the model (BOS, first token)
    ours, weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    assert_all_close(grads(ours, (q, k, v)), grads(ref, (q, k, v)), atol=1e-12)
    full = mask.expand(B, H, T_q, T_k)
    assert weights.shape == (B, H, T_q, T_k)
    assert torch.all(weights[~full] == 0)  # exactly zero, not just small
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T_q, dtype=DTYPE))


@pytest.mark.parametrize("kind", ["padding", "causal"])
def test_readable_attention_equals_the_one_the_model_runs_and_torchs(kind):
    """The book's few-line `attention` against `scaled_dot_product_attention` (the kernel) and
    torch's, in values, weights and gradients."""
    B, H, T, K = 3, 2, 5, 4
    q, k, v = leaf(B, H, T, K), leaf(B, H, T, K), leaf(B, H, T, K)
    if kind == "causal":
        mask = causal(T)  # (T, T)
    else:
        lengths = torch.tensor([5, 3, 1])
        mask = (torch.arange(T)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
    readable, readable_weights = attention(q, k, v, mask)
    kernel, kernel_weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for ours in (readable, kernel):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(readable, kernel, rtol=0, atol=1e-12)
    torch.testing.assert_close(readable_weights, kernel_weights, rtol=0, atol=1e-12)
    expected = grads(ref, (q, k, v))
    assert_all_close(grads(readable, (q, k, v)), expected, atol=1e-12)
    assert_all_close(grads(kernel, (q, k, v)), expected, atol=1e-12)


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


def test_attention_draws_dropout_like_the_dropout_module():
    q, k, v = leaf(2, 2, 4, 4), leaf(2, 2, 4, 4), leaf(2, 2, 4, 4)
    dropout = Dropout(0.5).train()
    torch.manual_seed(7)
    out, weights = scaled_dot_product_attention(q, k, v, dropout=dropout)
    torch.manual_seed(7)
    expected = dropout(weights) @ v  # the same uniform draws, over the weights' shape
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_attention_weights_are_softmax_of_scaled_scores():
    q, k, v = leaf(1, 1, 3, 4), leaf(1, 1, 6, 4), leaf(1, 1, 6, 4)
    out, weights = scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected @ v)


def test_fully_masked_row_gives_no_nan():
    q, k, v = leaf(1, 1, 2, 4), leaf(1, 1, 3, 4), leaf(1, 1, 3, 4)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert weights[0, 0, 0, 1] == 0


def test_attention_dropout_applies_to_weights_but_returns_clean_weights():
    q, k, v = leaf(2, 2, 4, 4), leaf(2, 2, 4, 4), leaf(2, 2, 4, 4)
    dropout = Dropout(0.5).train()
    out, weights = scaled_dot_product_attention(q, k, v, dropout=dropout)
    clean, clean_weights = scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(out, clean)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4, dtype=DTYPE))
    assert torch.equal(weights, clean_weights)  # the weights before dropout, bit for bit


# Multi-head attention


def paired_attention(d_model=8, n_heads=2):
    """Our MultiHeadAttention and nn.MultiheadAttention holding the same weights."""
    ours = MultiHeadAttention(d_model, n_heads).to(DTYPE)
    ref = nn.MultiheadAttention(d_model, n_heads, batch_first=True).to(DTYPE)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
        b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
        for proj, w, b in ((ours.q_proj, w_q, b_q), (ours.k_proj, w_k, b_k),
                           (ours.v_proj, w_v, b_v), (ours.out_proj, ref.out_proj.weight,
                                                     ref.out_proj.bias)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
    return ours, ref


def param_grads_match(ours, ref):
    """Our per-projection gradients equal the slices of nn.MultiheadAttention's packed ones."""
    g_w = torch.cat([ours.q_proj.weight.grad, ours.k_proj.weight.grad, ours.v_proj.weight.grad])
    g_b = torch.cat([ours.q_proj.bias.grad, ours.k_proj.bias.grad, ours.v_proj.bias.grad])
    torch.testing.assert_close(g_w, ref.in_proj_weight.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(g_b, ref.in_proj_bias.grad, rtol=0, atol=1e-10)
    torch.testing.assert_close(ours.out_proj.weight.grad, ref.out_proj.weight.grad, rtol=0,
                               atol=1e-10)


def test_multi_head_self_attention_with_causal_mask_matches_reference():
    ours, ref = paired_attention()
    x = leaf(2, 5, 8)
    out, weights = ours(x, x, x, AttentionScope(causal(5)))
    ref_out, ref_weights = ref(x, x, x, attn_mask=~causal(5), average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-12)  # (B, H, T, T)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    x_grad, x.grad = x.grad, None
    (ref_out * g).sum().backward()
    torch.testing.assert_close(x_grad, x.grad, rtol=0, atol=1e-10)
    param_grads_match(ours, ref)


def test_multi_head_cross_attention_with_padding_matches_reference():
    ours, ref = paired_attention()
    query, memory = leaf(2, 3, 8), leaf(2, 6, 8)
    lengths = torch.tensor([6, 4])
    keep = torch.arange(6)[None, :] < lengths[:, None]  # (B, S), True = real token
    out, weights = ours(query, memory, memory, AttentionScope(keep[:, None, None, :]))
    ref_out, ref_weights = ref(query, memory, memory, key_padding_mask=~keep)  # head average
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    assert weights.shape == (2, 2, 3, 6)
    torch.testing.assert_close(weights.mean(dim=1), ref_weights, rtol=0, atol=1e-12)
    assert torch.all(weights[1, :, :, 4:] == 0)
    inputs = (query, memory)
    assert_all_close(grads(out, inputs), grads(ref_out, inputs), atol=1e-10)


def test_self_attention_cache_matches_full_causal_pass():
    attn = MultiHeadAttention(8, 2).to(DTYPE)
    x = leaf(2, 6, 8)
    full, full_weights = attn(x, x, x, AttentionScope(causal(6)))
    cache = KVCache(grow=True)
    steps = []
    for t in range(4):  # one token at a time, then two at once
        out, _ = attn(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache)
        steps.append(out)
    chunk = x[:, 4:6]
    out, weights = attn(chunk, chunk, chunk, AttentionScope(causal(6)[4:6]), cache=cache)
    steps.append(out)
    assert cache.length == 6
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, full_weights[:, :, 4:6], rtol=0, atol=1e-12)


def test_cross_attention_cache_projects_memory_once():
    attn = MultiHeadAttention(8, 2).to(DTYPE)
    memory, query = leaf(2, 5, 8), leaf(2, 3, 8)
    cache = KVCache(grow=False)
    first, _ = attn(query[:, :1], memory, memory, cache=cache)
    k = cache.k
    second, _ = attn(query[:, 1:2], memory, memory, cache=cache)
    assert cache.k is k and cache.length == 5
    full, _ = attn(query, memory, memory)
    torch.testing.assert_close(torch.cat([first, second], 1), full[:, :2], rtol=0, atol=1e-12)


def test_attention_weights_are_not_stashed_on_the_module():
    attn = MultiHeadAttention(8, 2)
    before = set(vars(attn))
    x = torch.randn(1, 3, 8)
    attn(x, x, x)
    assert set(vars(attn)) == before


def test_d_model_must_divide_by_heads():
    """The config refuses it in one line; the layer only asserts its own invariant."""
    assert_clean_error(run_cli("train", "model.d_model=10", "model.n_heads=4"), 2,
                       "model.d_model (10) must be divisible by model.n_heads (4)")
    with pytest.raises(AssertionError, match=r"d_model \(10\).*n_heads \(4\)"):
        MultiHeadAttention(10, 4)


# Dropout and feed-forward


def test_dropout_is_identity_in_eval_and_for_zero_p():
    x = torch.randn(100)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_dropout_zeroes_about_p_and_keeps_the_mean():
    p = 0.3
    y = Dropout(p).train()(torch.ones(1_000_000))
    assert abs((y == 0).float().mean().item() - p) < 0.005
    assert abs(y.mean().item() - 1.0) < 0.01
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))  # inverted scaling


def test_dropout_uses_the_global_rng():
    x = torch.ones(1000)
    torch.manual_seed(5)
    a = Dropout(0.5).train()(x)
    torch.manual_seed(5)
    b = Dropout(0.5).train()(x)
    assert torch.equal(a, b)


def test_dropout_rejects_p_of_one():
    assert_clean_error(run_cli("train", "model.dropout=1.0"), 2, "model.dropout (1.0)")
    with pytest.raises(AssertionError, match=r"dropout p \(1.0\) must be in \[0, 1\)"):
        Dropout(1.0)


def test_feed_forward_is_linear_relu_linear():
    ff = FeedForward(4, 16).to(DTYPE)
    x = torch.randn(2, 3, 4, dtype=DTYPE)
    expected = F.linear(torch.relu(F.linear(x, ff.linear1.weight, ff.linear1.bias)),
                        ff.linear2.weight, ff.linear2.bias)
    torch.testing.assert_close(ff(x), expected)


# Positional encodings


def test_sinusoids_follow_the_paper():
    D = 8
    pe = SinusoidalPositions(16, D)(torch.zeros(1, 16, D))[0]  # (T, D)
    for pos in (0, 1, 7, 15):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoids_with_offset_and_beyond_the_cached_length():
    positions = SinusoidalPositions(4, 6)
    whole = positions(torch.zeros(1, 10, 6))  # longer than the cached 4
    tail = positions(torch.zeros(1, 3, 6), offset=7)
    torch.testing.assert_close(tail, whole[:, 7:10])
    assert "table" not in positions.state_dict()  # a cache, not saved in checkpoints


def test_learned_positions_beyond_max_len_assert():
    """Run-time lengths are checked before the model runs (catalog.position_shortfall)."""
    positions = LearnedPositions(8, 4)
    assert positions(torch.zeros(2, 8, 4)).shape == (2, 8, 4)
    with pytest.raises(AssertionError, match=r"position 8 is past the 8 learned ones"):
        positions(torch.zeros(2, 1, 4), offset=8)


def test_make_positional_kinds():
    assert isinstance(make_positional("sinusoidal", 8, 4), SinusoidalPositions)
    assert isinstance(make_positional("learned", 8, 4), LearnedPositions)
    rope = make_positional("rope", 8, 8, n_heads=2)
    assert isinstance(rope, RotaryPositions) and rope.inv_freq.shape == (2,)  # K/2 for K = 4
    alibi = make_positional("alibi", 8, 8, n_heads=2)
    assert isinstance(alibi, ALiBiPositions) and alibi.slopes.shape == (2,)
    x = torch.randn(1, 3, 4)
    for kind in ("none", "rope", "alibi"):  # nothing added to the embeddings
        assert torch.equal(make_positional(kind, 8, 4)(x, offset=2), x)
    assert isinstance(make_positional("none", 8, 4), NoPositions)
    with pytest.raises(AssertionError, match="'rotary' is not one of"):
        make_positional("rotary", 8, 4)
    assert_clean_error(run_cli("train", "model.positional=rotary"), 2,
                       "model.positional ('rotary') must be one of", "did you mean 'rope'")


def test_positions_given_explicitly_index_the_table():
    """Randomized positions hand (B, T) indices instead of an offset."""
    for scheme in (SinusoidalPositions(16, 4), LearnedPositions(16, 4)):
        x = torch.randn(2, 3, 4)
        positions = torch.tensor([[0, 5, 9], [2, 3, 15]])
        out = scheme(x, positions=positions)
        table = scheme(torch.zeros(1, 16, 4))[0]  # (16, D): each position's vector
        torch.testing.assert_close(out, x + table[positions])


def test_attention_bias_is_added_to_the_scaled_scores():
    q, k, v = leaf(1, 2, 3, 4), leaf(1, 2, 5, 4), leaf(1, 2, 5, 4)
    bias = torch.randn(2, 3, 5, dtype=DTYPE)  # (H, T_q, T_k)
    ours, weights = scaled_dot_product_attention(q, k, v, bias=bias)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # a float mask is added
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    assert_all_close(grads(ours, (q, k, v)), grads(ref, (q, k, v)), atol=1e-12)
