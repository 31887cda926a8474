"""Chapter 1's checks fail realistic wrong versions, each with the hint naming its mistake."""

import math

import pytest
import torch

import minitfm.book.attention as book
from minitfm.learn.checks import attention as hints
from minitfm.learn.grading import check_function


def attention_variant(scale=True, dim=-1, fill=None, bias_first=False, drop=True, cast=None):
    """The book's attention with one thing done wrong."""
    def attention(q, k, v, mask=None, bias=None, dropout=None):
        scores = q @ k.transpose(-2, -1)
        if bias is not None and bias_first:
            scores = scores + bias
        if scale:
            scores = scores / math.sqrt(q.size(-1))
        if bias is not None and not bias_first:
            scores = scores + bias
        if mask is not None:
            low = torch.finfo(scores.dtype).min if fill is None else fill
            scores = scores.masked_fill(~mask, low)
        weights = scores.softmax(dim=dim)
        dropped = dropout(weights) if dropout is not None and drop else weights
        out = dropped @ v
        return (out.to(cast) if cast else out), weights
    return attention


@pytest.mark.parametrize("variant, hint", [
    (attention_variant(scale=False), hints.SCALING),
    (attention_variant(dim=-2), hints.AXIS),
    (attention_variant(fill=float("-inf")), hints.NEG_INF),
    (attention_variant(bias_first=True), "the bias is added before the scaling"),
    (attention_variant(drop=False), "dropout is not applied"),
    (attention_variant(cast=torch.float32), "the input's dtype"),
], ids=["no scaling", "softmax axis", "-inf", "bias first", "no dropout", "float32"])
def test_wrong_attention_fails_with_its_hint(variant, hint):
    grade = check_function("attention", variant)
    assert grade.status == "failed" and hint in grade.hint, (grade.check, grade.message, grade.hint)


def test_an_inverted_mask_is_named():
    def inverted(q, k, v, mask=None, bias=None, dropout=None):
        if mask is not None:
            mask = ~mask
        return book.attention(q, k, v, mask, bias, dropout)

    grade = check_function("attention", inverted)
    assert grade.status == "failed" and hints.INVERTED in grade.hint


def test_multi_head_attention_without_the_transpose_fails():
    def forward(self, query, key, value, scope=book.EVERY_KEY, cache=None):
        B, T_q, D = query.shape
        q = self.q_proj(query).view(B, self.n_heads, T_q, self.d_head)  # no transpose
        k, v = self.project_kv(key, value, cache, scope.positions.keys)
        out, weights = book.attention(q, k, v, scope.mask, scope.positions.bias, self.dropout)
        out = self.heads(out).transpose(1, 2).reshape(B, T_q, D)
        return self.out_proj(out), weights

    grade = check_function("MultiHeadAttention.forward", forward)
    assert grade.status == "failed" and grade.hint == hints.SPLIT_NO_TRANSPOSE, grade.hint


def mha_variant(join_transpose=True, out_proj=True):
    """The book's MultiHeadAttention.forward written out, with one thing done wrong."""
    def forward(self, query, key, value, scope=book.EVERY_KEY, cache=None):
        B, T_q, D = query.shape
        q = self.split_heads(self.q_proj(query))
        if scope.positions.queries is not None:
            q = scope.positions.queries.rotate(q)
        k, v = self.project_kv(key, value, cache, scope.positions.keys)
        out, weights = book.attention(q, k, v, scope.mask, scope.positions.bias, self.dropout)
        out = self.heads(out)
        out = (out.transpose(1, 2) if join_transpose else out).reshape(B, T_q, D)
        return (self.out_proj(out) if out_proj else out), weights
    return forward


@pytest.mark.parametrize("variant, hint", [
    (mha_variant(join_transpose=False), hints.JOIN_NO_TRANSPOSE),
    (mha_variant(out_proj=False), hints.NO_OUT_PROJ),
], ids=["joined without transpose", "no out_proj"])
def test_wrong_multi_head_attention_fails_with_its_hint(variant, hint):
    grade = check_function("MultiHeadAttention.forward", variant)
    assert grade.status == "failed" and grade.hint == hint, (grade.check, grade.message,
                                                             grade.hint)


def test_the_multi_head_variant_without_a_mistake_passes():
    assert check_function("MultiHeadAttention.forward", mha_variant()).status == "passed"


def test_multi_head_attention_that_skips_the_hook_point_fails():
    def forward(self, query, key, value, scope=book.EVERY_KEY, cache=None):
        self.heads, heads = torch.nn.Identity(), self.heads  # a fresh identity: not hooked
        try:
            return book.MultiHeadAttention.forward(self, query, key, value, scope, cache)
        finally:
            self.heads = heads

    grade = check_function("MultiHeadAttention.forward", forward)
    assert grade.status == "failed" and "self.heads" in grade.hint


def test_a_cache_that_returns_only_the_new_keys_fails():
    def append(self, k, v):
        book.KVCache.append(self, k, v)
        return k, v  # only this step's

    grade = check_function("KVCache.append", append)
    assert grade.status == "failed" and "every key so far" in grade.hint


def test_multi_head_attention_without_dropout_on_the_weights_fails():
    def forward(self, query, key, value, scope=book.EVERY_KEY, cache=None):
        dropout, self.dropout = self.dropout, None  # attention then drops nothing
        try:
            return book.MultiHeadAttention.forward(self, query, key, value, scope, cache)
        finally:
            self.dropout = dropout

    grade = check_function("MultiHeadAttention.forward", forward)
    assert grade.status == "failed" and "pass self.dropout to attention" in grade.hint


def cache_variant(returned="all", copy_on_growth=True):
    """The book's KVCache.append written out, with one thing done wrong."""
    def append(self, k, v):
        start, end = self.length, self.length + k.size(2)
        before = (self.k, self.v)
        if self.buffers is None or end > self.buffers[0].size(2):
            room = max(end, 2 * start, 16)
            self.buffers = tuple(new.new_zeros(*new.shape[:2], room, new.size(3))
                                 for new in (k, v))
            if start and copy_on_growth:
                self.buffers[0][:, :, :start] = self.k
                self.buffers[1][:, :, :start] = self.v
        keys, values = self.buffers
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.k, self.v = keys[:, :, :end], values[:, :, :end]
        if returned == "one short":
            return keys[:, :, :end - 1], values[:, :, :end - 1]
        if returned == "before":
            return before
        if returned == "before, sliced":
            return keys[:, :, :start], values[:, :, :start]
        return self.k, self.v
    return append


@pytest.mark.parametrize("variant, hint", [
    (cache_variant(returned="one short"), hints.ONE_SHORT),
    (cache_variant(returned="before"), hints.STALE),
    (cache_variant(returned="before, sliced"), hints.STALE),
    (cache_variant(copy_on_growth=False), hints.LOST_ON_GROWTH),
], ids=["one short", "cache before this step", "buffer before this step", "lost on growth"])
def test_wrong_kv_cache_fails_with_its_hint(variant, hint):
    grade = check_function("KVCache.append", variant)
    assert grade.status == "failed" and grade.hint == hint, (grade.check, grade.message,
                                                             grade.hint)


def test_kv_caches_without_a_mistake_pass_buffered_or_concatenated():
    def concatenated(self, k, v):
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    assert check_function("KVCache.append", cache_variant()).status == "passed"
    assert check_function("KVCache.append", concatenated).status == "passed"


def test_a_view_after_a_transpose_is_named():
    def forward(self, query, key, value, scope=book.EVERY_KEY, cache=None):
        B, T_q, D = query.shape
        q = self.split_heads(self.q_proj(query))
        k, v = self.project_kv(key, value, cache, scope.positions.keys)
        out, weights = book.attention(q, k, v, scope.mask, scope.positions.bias, self.dropout)
        out = self.heads(out).transpose(1, 2).view(B, T_q, D)  # not contiguous
        return self.out_proj(out), weights

    grade = check_function("MultiHeadAttention.forward", forward)
    assert grade.status == "failed" and "not contiguous" in grade.hint
