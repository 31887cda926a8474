"""Attention (Vaswani et al. 2017, §3.2), the book's first chapter.

In reading order: `attention`, scaled dot-product attention in a few lines, the one the model
runs; `KVCache`, the keys and values kept between decoding steps; `AttentionScope`, what one
call attends over; and `MultiHeadAttention` (§3.2.2), H heads side by side.

Shapes: B batch, S source len, T target len, D d_model, H n_heads, K d_head (= D / H);
T_q and T_k are the query and key lengths of one attention call (T and S in cross-attention,
T and T in decoder self-attention).

Masks are boolean with True meaning "may attend", broadcastable to (B, H, T_q, T_k).

A user's values are checked by the config, with messages naming its keys; the asserts here
only state each primitive's own invariants (d_model a multiple of n_heads).

Positions reach attention as an `AttentionPositions` (RoPE rotations, an ALiBi bias), made by
the schemes in `positions.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from minitfm.book.layers import Dropout
from minitfm.book.positions import NO_POSITIONS, AttentionPositions, Rotation


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              bias: Tensor | None = None,
              dropout: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, Vaswani et al. 2017, §3.2.1, eq. 1; returns
    (output, weights).

    `mask` hides keys (True = may attend); `bias` is added to the scaled scores (ALiBi's
    distance penalty, Press et al. 2022); `dropout` drops attention weights in training
    (§5.4). The weights are returned before dropout: each row is a distribution over the keys.
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T_q, T_k)
    if bias is not None:
        scores = scores + bias  # (B, H, T_q, T_k)
    if mask is not None:  # the lowest value, not -inf: a fully masked row stays finite
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (B, H, T_q, T_k), each row a distribution over keys
    dropped = weights if dropout is None else dropout(weights)  # (B, H, T_q, T_k)
    return dropped @ v, weights  # (B, H, T_q, K), (B, H, T_q, T_k)


@dataclass
class KVCache:
    """Projected keys and values of one attention layer, kept between decoding steps.

    Self-attention appends each step's new keys and values (`grow=True`); cross-attention
    projects the encoder memory once and reuses it (`grow=False`). The appended keys and
    values go into buffers with room to spare, doubled when full, so that a step copies only
    its own keys, not all of them again (`k` and `v` are views of the buffers' filled part).
    """

    grow: bool = True
    k: Tensor | None = None  # (B, H, T_k, K)
    v: Tensor | None = None  # (B, H, T_k, K)
    buffers: tuple[Tensor, Tensor] | None = field(default=None, repr=False)  # (B, H, room, K)

    @property
    def length(self) -> int:
        """Number of cached key positions (0 when empty)."""
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values (B, H, T_new, K); returns all of them so far."""
        start, end = self.length, self.length + k.size(2)
        if self.buffers is None or end > self.buffers[0].size(2):
            room = max(end, 2 * start, 16)  # doubling: O(1) copies per step on average
            self.buffers = tuple(new.new_empty(*new.shape[:2], room, new.size(3))
                                 for new in (k, v))
            if start:
                self.buffers[0][:, :, :start] = self.k
                self.buffers[1][:, :, :start] = self.v
        keys, values = self.buffers
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.k, self.v = keys[:, :, :end], values[:, :, :end]  # (B, H, T_k, K) views
        return self.k, self.v


@dataclass(frozen=True)
class AttentionScope:
    """What one attention call attends over: the keys it may see and what positions do there.

    Built once per encode or decode call and shared by every layer, as its parts are the same
    in each: the mask (None: every key) and what positions do inside attention (RoPE, ALiBi,
    from `positions.py`).
    """

    mask: Tensor | None = None  # (B, 1, 1, T_k) padding or (T_q, T_k) causal, True = may attend
    positions: AttentionPositions = NO_POSITIONS


EVERY_KEY = AttentionScope()  # frozen, so one shared instance is safe: no mask, nothing else


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017, §3.2.2: H heads of width K = D / H.

    `heads` is a hook point: a named identity applied to the head outputs (B, H, T_q, K) before
    they are concatenated and projected by W^O. Instruments attach forward hooks to it from
    outside, as TransformerLens does, instead of adding parameters here (`minitfm ablate`).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        assert d_model % n_heads == 0, \
            f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})"
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
        self.heads = nn.Identity()  # the hook point on the head outputs, see above

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, scope: AttentionScope = EVERY_KEY,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from `query` (B, T_q, D) to `key`/`value` (B, T_k, D); returns output, weights.

        `scope` holds the mask and what RoPE or ALiBi do here; `cache` keeps the keys and
        values between decoding steps.
        """
        B, T_q, D = query.shape
        positions = scope.positions
        q = self.split_heads(self.q_proj(query))  # (B, H, T_q, K)
        if positions.queries is not None:
            q = positions.queries.rotate(q)  # (B, H, T_q, K), RoPE
        k, v = self.project_kv(key, value, cache, positions.keys)  # (B, H, T_k, K) each
        out, weights = attention(q, k, v, scope.mask, positions.bias, self.dropout)
        out = self.heads(out)  # (B, H, T_q, K): the hook point, the identity unless hooked
        out = out.transpose(1, 2).reshape(B, T_q, D)  # (B, T_q, D): heads concatenated
        return self.out_proj(out), weights  # (B, T_q, D), (B, H, T_q, T_k)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K): one slice of width K per head, each head's (T, K) matrix
        contiguous, as the batched matmuls of attention read them (copied once, here)."""
        B, T, _ = x.shape
        heads = x.view(B, T, self.n_heads, self.d_head)  # (B, T, H, K)
        return heads.transpose(1, 2).contiguous()  # (B, H, T, K)

    def project_kv(
        self, key: Tensor, value: Tensor, cache: KVCache | None, rotation: Rotation | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Keys and values for this call, read from or written to `cache` when one is given."""
        if cache is not None and not cache.grow and cache.k is not None:
            return cache.k, cache.v  # cross-attention: the memory was projected at step 0
        k, v = self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(value))
        return self.rotate_and_cache(k, v, cache, rotation)  # (B, H, T_k, K) each

    @staticmethod
    def rotate_and_cache(k: Tensor, v: Tensor, cache: KVCache | None,
                         rotation: Rotation | None) -> tuple[Tensor, Tensor]:
        """This call's keys and values (B, H, T_new, K), RoPE-rotated, then cached: all so far."""
        if rotation is not None:  # RoPE: rotated before caching, so a cached key never changes
            k = rotation.rotate(k)  # (B, H, T_new, K)
        if cache is None:
            return k, v
        if not cache.grow:  # cross-attention, step 0: keep the memory's keys and values
            cache.k, cache.v = k, v
            return k, v
        return cache.append(k, v)  # (B, H, T_cached + T_new, K) each
