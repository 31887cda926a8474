"""Chapter 1, attention: the readable `attention` and multi-head attention against PyTorch's
own (values and gradients, in float64), masks, dropout, ALiBi's bias and the KV cache."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minitfm.book.attention import AttentionScope, KVCache, MultiHeadAttention, attention
from minitfm.book.layers import Dropout
from tests.book.helpers import DTYPE, assert_all_close, causal, grads, leaf


@pytest.mark.parametrize("kind", ["random", "padding", "causal"])
def test_attention_matches_torch(kind):
    B, H, T_q, T_k, K = 3, 2, 5, 5, 4
    q, k, v = leaf(B, H, T_q, K), leaf(B, H, T_k, K), leaf(B, H, T_k, K)
    if kind == "causal":
        mask = causal(T_q)  # (T, T), broadcast over B and H
    elif kind == "padding":
        lengths = torch.tensor([5, 3, 1])
        mask = (torch.arange(T_k)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
    else:
        mask = torch.rand(B, 1, T_q, T_k) < 0.6
        mask[..., 0] = True  # every row keeps a key, as in the model (BOS, first token)
    ours, weights = attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    assert_all_close(grads(ours, (q, k, v)), grads(ref, (q, k, v)), atol=1e-12)
    full = mask.expand(B, H, T_q, T_k)
    assert weights.shape == (B, H, T_q, T_k)
    assert torch.all(weights[~full] == 0)  # exactly zero, not just small
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T_q, dtype=DTYPE))


def test_attention_weights_are_softmax_of_scaled_scores():
    q, k, v = leaf(1, 1, 3, 4), leaf(1, 1, 6, 4), leaf(1, 1, 6, 4)
    out, weights = attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, expected @ v)


def test_fully_masked_row_gives_no_nan():
    q, k, v = leaf(1, 1, 2, 4), leaf(1, 1, 3, 4), leaf(1, 1, 3, 4)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out, weights = attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert weights[0, 0, 0, 1] == 0
    torch.testing.assert_close(weights[0, 0, 1], torch.full((3,), 1 / 3, dtype=DTYPE))


def test_attention_bias_is_added_to_the_scaled_scores():
    q, k, v = leaf(1, 2, 3, 4), leaf(1, 2, 5, 4), leaf(1, 2, 5, 4)
    bias = torch.randn(2, 3, 5, dtype=DTYPE)  # (H, T_q, T_k), as ALiBi's
    ours, weights = attention(q, k, v, bias=bias)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # a float mask is added
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    assert_all_close(grads(ours, (q, k, v)), grads(ref, (q, k, v)), atol=1e-12)


def test_attention_drops_weights_but_returns_them_clean():
    q, k, v = leaf(2, 2, 4, 4), leaf(2, 2, 4, 4), leaf(2, 2, 4, 4)
    dropout = Dropout(0.5).train()
    torch.manual_seed(7)
    out, weights = attention(q, k, v, dropout=dropout)
    clean, clean_weights = attention(q, k, v)
    assert not torch.allclose(out, clean)
    assert torch.equal(weights, clean_weights)  # the weights before dropout, bit for bit
    torch.manual_seed(7)
    torch.testing.assert_close(out, dropout(weights) @ v, rtol=0, atol=1e-12)


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
    """The config refuses it in one line (tests/test_config.py); the layer asserts its own
    invariant."""
    with pytest.raises(AssertionError, match=r"d_model \(10\).*n_heads \(4\)"):
        MultiHeadAttention(10, 4)
