"""Checks of chapter 1, attention: `attention`, `MultiHeadAttention.forward`, `KVCache.append`.

Shapes: B batch, H heads, T_q and T_k query and key lengths, K d_head, D d_model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from minitfm.book.attention import AttentionScope, KVCache, MultiHeadAttention
from minitfm.book.layers import Dropout
from minitfm.book.positions import ALiBiPositions, RotaryPositions
from minitfm.learn.checks import DTYPE, Mismatch, Subject, expect, gradients, leaf, same

SCALING = "scores too large by about √d_k: the scaling by 1/sqrt(d_k) is missing"
AXIS = ("rows do not sum to one: the softmax runs over the queries; take it over the keys "
        "(dim=-1)")
SQUARE = "the scores are divided by d_k: divide by its square root, sqrt(d_k)"
INVERTED = "the mask is read the wrong way round: True means \"may attend\", so fill where ~mask"
IGNORED = "a masked key gets weight: the mask is not applied to the scores"
NEG_INF = ("a fully masked row gives NaN: fill masked scores with torch.finfo(dtype).min, not "
           "-inf (exp(-inf - -inf) is 0/0)")


def qkv(T_q: int = 5, T_k: int = 6, seed: int = 0):
    """Queries (2, 3, T_q, 4), keys and values (2, 3, T_k, 4), float64, recording gradients."""
    return leaf(2, 3, T_q, 4, seed=seed), leaf(2, 3, T_k, 4, seed=seed + 1), \
        leaf(2, 3, T_k, 4, seed=seed + 2)


def weighted(scores, v, mask=None, fill=None, dim=-1):
    """Scores masked (where ~mask, or where `fill`) and softmaxed over `dim`, times v."""
    if mask is not None:
        scores = scores.masked_fill(~mask if fill is None else fill, torch.finfo(DTYPE).min)
    return scores.softmax(dim=dim) @ v


def right(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


def wrong_outputs(q, k, v, mask=None) -> dict[str, torch.Tensor]:
    """The outputs of the usual mistakes, each named by its hint."""
    with torch.no_grad():
        plain = q @ k.transpose(-2, -1)  # (B, H, T_q, T_k), not scaled
        wrong = {SCALING: weighted(plain, v, mask), SQUARE: weighted(plain / q.size(-1), v, mask),
                 AXIS: weighted(right(q, k), v, mask, dim=-2)}
        if mask is not None:
            wrong[INVERTED] = weighted(right(q, k), v, mask, fill=mask)
            wrong[IGNORED] = weighted(right(q, k), v)
    return wrong


def pair(result, what: str):
    if not isinstance(result, tuple) or len(result) != 2:
        raise Mismatch(f"{what} returned {type(result).__name__}, not (output, weights)",
                       "return the output and the weights, as the book's docstring says")
    return result


def attention_matches_torch(s: Subject) -> None:
    """output and weights without a mask, against torch's scaled_dot_product_attention"""
    q, k, v = qkv()
    out, weights = pair(s(q, k, v), "attention(q, k, v)")
    expected = F.scaled_dot_product_attention(q, k, v)
    expect(out, expected, "the output", wrong_outputs(q, k, v))
    expect(weights, right(q, k).softmax(-1), "the weights", hint=AXIS)


def attention_masks(s: Subject) -> None:
    """a padding mask (B, 1, 1, T_k) and a causal one (T, T), as the model passes them"""
    q, k, v = qkv(6, 6)
    lengths = torch.tensor([6, 3])
    padding = (torch.arange(6)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T_k)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()  # (T_q, T_k)
    for mask, what in ((padding, "with a padding mask"), (causal, "with a causal mask")):
        out, weights = pair(s(q, k, v, mask), f"attention {what}")
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        expect(out, expected, f"the output {what}", wrong_outputs(q, k, v, mask))
        if bool((weights.detach() * ~mask).abs().sum() > 0):
            raise Mismatch(f"{what}, a masked key gets weight", IGNORED)


def attention_fully_masked_row(s: Subject) -> None:
    """a row whose every key is masked stays finite (uniform weights), as in the model"""
    q, k, v = qkv(2, 3)
    mask = torch.tensor([[True, False, True], [False, False, False]])  # row 1: nothing
    out, weights = pair(s(q, k, v, mask), "attention with a fully masked row")
    if not (torch.isfinite(out).all() and torch.isfinite(weights).all()):
        raise Mismatch("a fully masked row gives NaN or inf", NEG_INF)
    expect(weights[..., 1, :], torch.full((2, 3, 3), 1 / 3, dtype=DTYPE),
           "the weights of the fully masked row", hint=NEG_INF)


def attention_bias(s: Subject) -> None:
    """ALiBi's bias (H, T_q, T_k) is added to the scaled scores"""
    q, k, v = qkv()
    bias = torch.randn(3, 5, 6, dtype=DTYPE, generator=torch.Generator().manual_seed(5))
    out, _ = pair(s(q, k, v, bias=bias), "attention(q, k, v, bias=bias)")
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # a float mask is added
    with torch.no_grad():
        unscaled = ((q @ k.transpose(-2, -1) + bias) / 2.0).softmax(-1) @ v  # K = 4: sqrt 2
        no_bias = F.scaled_dot_product_attention(q, k, v)
    expect(out, expected, "the output with a bias", {
        "the bias is added before the scaling: add it to the scaled scores": unscaled,
        "the bias is not added to the scores": no_bias})


def attention_gradients(s: Subject) -> None:
    """gradients of q, k and v, against torch's (the backward pass autograd builds)"""
    q, k, v = qkv()
    causal = torch.ones(5, 6, dtype=torch.bool).tril()
    out, _ = pair(s(q, k, v, causal), "attention")
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    for name, got, want in zip("qkv", gradients(out, [q, k, v]), gradients(expected, [q, k, v]),
                               strict=True):
        if got is None:
            raise Mismatch(f"no gradient reaches {name}", "compute with tensor operations only "
                           "(no .detach(), .item() or .data on the way)")
        expect(got, want, f"the gradient of {name}")


def attention_dropout(s: Subject) -> None:
    """dropout on the weights (the module passed in), which are returned before dropout"""
    q, k, v = qkv()
    dropout = Dropout(0.5).train()
    torch.manual_seed(3)
    out, weights = pair(s(q, k, v, dropout=dropout), "attention with dropout")
    clean = right(q, k).softmax(-1)
    torch.manual_seed(3)
    expected = dropout(clean) @ v  # the same draws, over the weights
    expect(weights, clean, "the weights returned with dropout",
           hint="return the weights before dropout: each row a distribution over the keys")
    expect(out, expected, "the output with dropout", {
        "dropout is not applied: pass the weights through dropout before the product with v":
            (clean @ v).detach()})


# --- multi-head attention ---

def paired_attention(s: Subject, d_model: int = 8, heads: int = 2):
    """The learner's MultiHeadAttention and torch's nn.MultiheadAttention, the same weights."""
    torch.manual_seed(0)
    ours = s.owner()(d_model, heads).to(DTYPE)
    ref = nn.MultiheadAttention(d_model, heads, batch_first=True).to(DTYPE)
    with torch.no_grad():
        w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
        b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
        for proj, w, b in ((ours.q_proj, w_q, b_q), (ours.k_proj, w_k, b_k),
                           (ours.v_proj, w_v, b_v),
                           (ours.out_proj, ref.out_proj.weight, ref.out_proj.bias)):
            proj.weight.copy_(w)
            proj.bias.copy_(b.normal_(generator=torch.Generator().manual_seed(1)))
    return ours, ref


HEADS = ("check the split into heads: view (B, T, H, K), then transpose to (B, H, T, K); and "
         "back: transpose to (B, T, H, K), reshape to (B, T, D), then out_proj")
SPLIT_NO_TRANSPOSE = ("the split into heads has no transpose: q_proj(query) is (B, T, D); view "
                      "it as (B, T, H, K), then transpose(1, 2) to (B, H, T, K) (split_heads "
                      "does both); a view straight to (B, H, T, K) mixes positions and heads")
JOIN_NO_TRANSPOSE = ("the heads are joined without the transpose: the head outputs are (B, H, "
                     "T, K); transpose(1, 2) to (B, T, H, K) before the reshape to (B, T, D), "
                     "else positions and heads are mixed up")
NO_OUT_PROJ = ("the output projection is missing: the heads, concatenated to (B, T, D), go "
               "through self.out_proj (W^O, §3.2.2) before they are returned")


def mha_wrong(ours, x, mask) -> dict[str, torch.Tensor]:
    """The outputs of the usual mistakes of multi-head self-attention over x (B, T, D), each
    named by its hint, with the learner's weights."""
    B, T, D = x.shape
    H, K = ours.n_heads, ours.d_head
    with torch.no_grad():
        def heads(proj, transposed=True):
            projected = proj(x)  # (B, T, D)
            return projected.view(B, T, H, K).transpose(1, 2) if transposed \
                else projected.view(B, H, T, K)  # (B, H, T, K)

        k, v = heads(ours.k_proj), heads(ours.v_proj)
        out = weighted(right(heads(ours.q_proj), k), v, mask)  # (B, H, T, K)
        split = weighted(right(heads(ours.q_proj, False), k), v, mask)  # (B, H, T, K)
        return {NO_OUT_PROJ: out.transpose(1, 2).reshape(B, T, D),
                JOIN_NO_TRANSPOSE: ours.out_proj(out.reshape(B, T, D)),
                SPLIT_NO_TRANSPOSE: ours.out_proj(split.transpose(1, 2).reshape(B, T, D))}


def mha_matches_torch(s: Subject) -> None:
    """self- and cross-attention with masks, against torch's nn.MultiheadAttention"""
    ours, ref = paired_attention(s)
    x, memory = leaf(2, 5, 8), leaf(2, 7, 8, seed=3)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    out, weights = pair(ours(x, x, x, AttentionScope(causal)), "MultiHeadAttention (causal)")
    ref_out, ref_weights = ref(x, x, x, attn_mask=~causal, average_attn_weights=False)
    expect(out, ref_out, "the self-attention output", mha_wrong(ours, x, causal), hint=HEADS)
    expect(weights, ref_weights, "the weights (B, H, T_q, T_k)", hint=HEADS)
    keep = torch.arange(7)[None, :] < torch.tensor([7, 4])[:, None]  # (B, S)
    out, _ = pair(ours(x, memory, memory, AttentionScope(keep[:, None, None, :])), "cross")
    ref_out, _ = ref(x, memory, memory, key_padding_mask=~keep)
    expect(out, ref_out, "the cross-attention output (queries from x, keys from memory)",
           hint="keys and values come from `key` and `value`, queries from `query`")
    got = gradients(out, [x, memory, ours.q_proj.weight])
    want = gradients(ref_out, [x, memory, ref.in_proj_weight])
    expect(got[1], want[1], "the gradient of the memory")
    expect(got[2], want[2][:8], "the gradient of q_proj.weight")


def mha_uses_the_hook_point_and_positions(s: Subject) -> None:
    """the head outputs pass through `heads` (instruments hook it); RoPE and ALiBi are applied"""
    ours, _ = paired_attention(s, 8, 2)
    book = MultiHeadAttention(8, 2).to(DTYPE)
    book.load_state_dict(ours.state_dict())
    seen = []
    ours.heads.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = leaf(2, 5, 8)
    ours(x, x, x)
    if seen != [torch.Size([2, 2, 5, 4])]:
        raise Mismatch(f"the heads hook point saw {seen}, expected one call with (B, H, T, K) = "
                       f"(2, 2, 5, 4)", "pass the head outputs through self.heads before "
                       "concatenating them: minitfm ablate hooks it there")
    positions = torch.arange(5)
    for scheme, name in ((RotaryPositions(4), "RoPE"), (ALiBiPositions(2), "ALiBi")):
        scope = AttentionScope(None, scheme.attention(positions, positions))
        expect(pair(ours(x, x, x, scope), name)[0], book(x, x, x, scope)[0],
               f"the output with {name}", hint="rotate q by scope.positions.queries, keys by "
               "positions.keys (project_kv does it), and pass positions.bias to attention")


def mha_with_a_cache(s: Subject) -> None:
    """decoding one token at a time with a KV cache equals one causal pass"""
    ours, _ = paired_attention(s)
    x = leaf(2, 6, 8)
    full, _ = pair(ours(x, x, x, AttentionScope(torch.ones(6, 6, dtype=torch.bool).tril())), "")
    cache = KVCache(grow=True)
    steps = [pair(ours(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache), "")[0]
             for t in range(6)]
    expect(torch.cat(steps, dim=1), full, "the outputs decoded step by step with a cache",
           hint="pass the cache to project_kv, which appends this step's keys and values")


def mha_drops_attention_weights(s: Subject) -> None:
    """in training, dropout on the attention weights (self.dropout, passed to attention)"""
    ours, _ = paired_attention(s)
    ours.dropout.p = 0.5
    book = MultiHeadAttention(8, 2, dropout=0.5).to(DTYPE)
    book.load_state_dict(ours.state_dict())
    x = leaf(2, 5, 8)
    torch.manual_seed(4)
    out = pair(ours.train()(x, x, x), "MultiHeadAttention in training")[0]
    torch.manual_seed(4)
    expected = book.train()(x, x, x)[0]
    with torch.no_grad():
        undropped = book.eval()(x, x, x)[0]
    expect(out, expected, "the output in training with dropout 0.5", {
        "no dropout on the attention weights: pass self.dropout to attention":
            undropped}, hint="pass self.dropout to attention, which drops the weights")


# --- the KV cache ---

APPEND = ("copy the new keys after the cached ones, and return every key so far (the filled "
          "part of the buffer, [:, :, :end])")
ONE_SHORT = ("one position short: return the filled part up to end, [:, :, :end], this step's "
             "keys included (end is the length before this step plus the new keys)")
STALE = ("the keys cached before this step are returned: add this step's keys first, then "
         "return everything so far, this step's included")
LOST_ON_GROWTH = ("the cached keys are lost when the buffers grow: copy what is cached into "
                  "the new buffers (new[:, :, :start] = old) before adding this step's keys")


def cache_fault(got, expected: torch.Tensor, start: int) -> str:
    """What the keys an append returned say is wrong, `start` keys having been cached before
    this step ("" when nothing recognisable)."""
    if got is None and start == 0:  # the cache as it was before the first step: empty
        return STALE
    if not isinstance(got, torch.Tensor) or got.dim() != 4 or got.shape[:2] != expected.shape[:2]:
        return ""
    end = expected.size(2)
    if got.size(2) == end - 1:
        return ONE_SHORT
    if got.size(2) == start:
        return STALE
    if got.shape != expected.shape:
        return ""
    cached_ok = same(got[:, :, :start], expected[:, :, :start])
    return LOST_ON_GROWTH if same(got[:, :, start:], expected[:, :, start:]) and not cached_ok \
        else ""


def cache_appends(s: Subject) -> None:
    """appending returns every key and value so far, past the buffers' first room too"""
    cache = s.owner()(grow=True)
    keys, values = [], []
    for t in range(40):  # more than the 16 a buffer starts with: it must grow
        start = sum(k.size(2) for k in keys)
        k, v = leaf(2, 3, 2 - t % 2, 4, seed=t), leaf(2, 3, 2 - t % 2, 4, seed=100 + t)
        keys.append(k.detach())
        values.append(v.detach())
        got = cache.append(k.detach(), v.detach())
        if not isinstance(got, tuple) or len(got) != 2:
            raise Mismatch("append returned no (keys, values) pair", "return all of them so far")
        for what, returned, so_far in (("keys", got[0], keys), ("values", got[1], values)):
            expected = torch.cat(so_far, 2)  # (B, H, end, K)
            hint = cache_fault(returned, expected, start)
            if returned is None and hint:
                raise Mismatch(f"the {what} after {t + 1} appends: None, the cache as it was "
                               f"before this step", hint)
            expect(returned, expected, f"the {what} after {t + 1} appends", hint=hint or APPEND)
    if cache.length != sum(k.size(2) for k in keys):
        raise Mismatch(f"cache.length is {cache.length} after {sum(k.size(2) for k in keys)} keys",
                       "set self.k and self.v to what you return: length reads self.k")


CHECKS = {
    "attention": (attention_matches_torch, attention_masks, attention_fully_masked_row,
                  attention_bias, attention_gradients, attention_dropout),
    "MultiHeadAttention.forward": (mha_matches_torch, mha_uses_the_hook_point_and_positions,
                                   mha_with_a_cache, mha_drops_attention_weights),
    "KVCache.append": (cache_appends,),
}
