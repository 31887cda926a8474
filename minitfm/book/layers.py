"""Hand-written transformer primitives (Vaswani et al. 2017, "Attention Is All You Need").

Attention, multi-head attention, layer norm, dropout and the feed-forward block
(positional encodings are in `positions.py`), written from tensor operations
so each line can be read against the papers: Vaswani et al. 2017 §3.2 (attention), §3.3
(feed-forward); Ba et al. 2016 §3 (layer norm, here with gain γ and shift δ); Srivastava et
al. 2014 §4 (dropout with a Bernoulli mask).

Shapes: B batch, S source len, T target len, D d_model, H n_heads, K d_head (= D / H),
F d_ff; T_q and T_k are the query and key lengths of one attention call (T and S in
cross-attention, T and T in decoder self-attention).

Masks are boolean with True meaning "may attend", broadcastable to (B, H, T_q, T_k).

A user's values are checked by the config, with messages naming its keys; the asserts here
only state each primitive's own invariants (d_model a multiple of n_heads, p in [0, 1)).

Positions reach attention as an `AttentionPositions` (RoPE rotations, an ALiBi bias), made by
the schemes in `positions.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout: Dropout | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, Vaswani et al. 2017, §3.2.1; returns (output, weights).

    The weights are returned before dropout, so each row is a distribution over the keys.
    `bias` (broadcast to (B, H, T_q, T_k)) is ALiBi's distance penalty, added after scaling.
    The sums are `AttentionFunction`'s, whose backward is written out.
    """
    additive = bias  # (B or 1, H, T_q, T_k) or None: whatever is added to the scores
    if mask is not None:
        masked = additive_mask(mask, q.dtype)  # (B, 1, 1, T_k) or (T_q, T_k)
        additive = masked if additive is None else additive + masked
    keep = None  # dropout on the weights: Z / (1 - p) per weight, drawn here
    if dropout is not None and dropout.active:
        keep = dropout.scale(q.shape[:-1] + (k.size(-2),), q)  # (B, H, T_q, T_k)
    return AttentionFunction.apply(q, k, v, additive, keep)


def softmax_(scores: Tensor) -> Tensor:
    """softmax over the last dim: exp(S - max S) / sum exp(S - max S), per row (in place for
    rows shorter than 16).

    Subtracting the row's max changes nothing in the result but keeps exp from overflowing;
    a row of only masked keys (all the lowest value) becomes uniform. torch's CPU softmax is
    one fast pass on rows of 16 keys or more, but ~5x slower than these four passes on
    shorter rows (decoding, short inputs), so those are written out.
    """
    if scores.size(-1) >= 16 or scores.device.type != "cpu":
        return scores.softmax(dim=-1)
    scores -= scores.amax(dim=-1, keepdim=True)
    scores.exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


class AttentionFunction(torch.autograd.Function):
    """Scaled dot-product attention with its backward written out (Vaswani et al. 2017, §3.2.1).

    Forward, with s = 1 / sqrt(K), A the additive mask/bias and M the dropout scale (or 1):

        S = (s Q) K^T + A,   P = softmax(S) (rows, `softmax_`),   O = (P ⊙ M) V

    Backward, from dL/dO (written dO; every product is per batch and head):

        dV = (P ⊙ M)^T dO                           (T_k, K)
        dP = (dO V^T) ⊙ M                            (T_q, T_k)
        dS = P ⊙ dP - P ⊙ rowsum(P ⊙ dP)             the softmax Jacobian, diag(p) - p p^T
        dQ = s (dS K),   dK = dS^T (s Q)

    Autograd keeps S, the scaled scores and the dropped weights, and scales the (T_q, T_k)
    scores once each way; here only P (and M) and s Q are kept, and s multiplies the smaller
    (T, K) matrices: Q in forward, dS K in backward.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")  # backward runs under forward's autocast state
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, additive: Tensor | None,
                keep: Tensor | None) -> tuple[Tensor, Tensor]:
        scaled_q = q * q.size(-1) ** -0.5  # s Q, (B, H, T_q, K)
        scores = scaled_q @ k.transpose(-2, -1)  # S, (B, H, T_q, T_k)
        # The softmax in at least float32 (under CUDA autocast the scores are bfloat16).
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        if additive is not None:
            scores += additive  # + A: the mask's lowest value, ALiBi's distances
        weights = softmax_(scores)  # P, (B, H, T_q, T_k), rows sum to 1
        dropped = weights if keep is None else weights * keep  # P ⊙ M
        ctx.save_for_backward(scaled_q, k, v, weights, keep)
        ctx.mark_non_differentiable(weights)  # returned for inspection, not for a loss
        return dropped @ v, weights  # O (B, H, T_q, K), P (B, H, T_q, T_k)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_out: Tensor, _grad_weights: Tensor) -> tuple[Tensor | None, ...]:
        scaled_q, k, v, weights, keep = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dropped = weights if keep is None else weights * keep  # P ⊙ M, (B, H, T_q, T_k)
        grad_v = dropped.transpose(-2, -1) @ grad_out if need_v else None  # dV, (B, H, T_k, K)
        grad_scores = grad_out @ v.transpose(-2, -1)  # dO V^T, (B, H, T_q, T_k)
        if keep is not None:
            grad_scores *= keep  # dP
        grad_scores *= weights  # P ⊙ dP
        row = grad_scores.sum(dim=-1, keepdim=True)  # rowsum(P ⊙ dP), (B, H, T_q, 1)
        grad_scores.addcmul_(weights, row, value=-1)  # dS, (B, H, T_q, T_k)
        grad_q = None
        if need_q:  # dQ, (B, H, T_q, K)
            grad_q = (grad_scores @ k).mul_(scaled_q.size(-1) ** -0.5)
        grad_k = grad_scores.transpose(-2, -1) @ scaled_q if need_k else None  # dK
        return grad_q, grad_k, grad_v, None, None


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean mask (True = may attend) -> 0 where allowed, the dtype's lowest value elsewhere.

    Added to the scores, the lowest value swamps any score, so a masked key gets exp(min - max)
    = 0 exactly; unlike -inf, a row with every key masked becomes uniform instead of 0/0 = NaN.
    Adding costs one pass over the scores and nothing in backward (torch.where costs one each
    way), and the mask itself is small: (B, 1, 1, T_k) or (T_q, T_k).
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)


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
class Rotation:
    """RoPE angles of a run of positions (Su et al. 2021, §3.4.2): cos and sin per feature pair."""

    cos: Tensor  # (T, K/2), or (B, 1, T, K/2) for per-row positions
    sin: Tensor  # same shape as cos

    def rotate(self, x: Tensor) -> Tensor:
        """Turn each pair (x_2i, x_2i+1) of x (B, H, T_x, K) by the last T_x positions' angles.

        The last ones, because new keys come after the cached ones: with a KV cache the rotation
        holds every key position while x holds only the keys of this step.
        """
        T = x.size(-2)
        cos, sin = self.cos[..., -T:, :], self.sin[..., -T:, :]  # (..., T, K/2)
        even, odd = x[..., 0::2], x[..., 1::2]  # (B, H, T, K/2) each
        turned = (even * cos - odd * sin, even * sin + odd * cos)  # (B, H, T, K/2) each
        return torch.stack(turned, dim=-1).flatten(-2)  # (B, H, T, K): pairs back in place


@dataclass(frozen=True)
class AttentionPositions:
    """What positions do inside one attention call: RoPE rotations, an ALiBi bias (None: none)."""

    queries: Rotation | None = None  # angles of the query positions
    keys: Rotation | None = None  # angles of every key position, cached ones first
    bias: Tensor | None = None  # (H, T_q, T_k) or (B, H, T_q, T_k), added to the scores


NO_POSITIONS = AttentionPositions()  # frozen, so one shared instance is safe: nothing to do


@dataclass(frozen=True)
class Packing:
    """The real (non-PAD) tokens of a padded batch (B, T), packed into rows (N, ...).

    Position-wise work (the projections, the feed-forward block, layer norm) then skips the
    padding, ~45% of a default batch (lengths 1..16 padded to the longest); attention unpacks
    to the padded grid, where its masks hide the padding.
    """

    index: Tensor  # (N,) flat positions b * T + t of the real tokens, in order
    B: int
    T: int

    @property
    def columns(self) -> Tensor:
        """(N,) the position t of each real token in its row."""
        return self.index % self.T

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the real tokens' rows."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, T, ...), zeros at the padding."""
        padded = x.new_zeros(self.B * self.T, *x.shape[1:])
        return padded.index_copy_(0, self.index, x).view(self.B, self.T, *x.shape[1:])


@dataclass(frozen=True)
class AttentionPacking:
    """How one attention call's inputs are packed (None: padded, (B, T, D))."""

    queries: Packing | None = None  # `query`, and the output, which is packed alike
    keys: Packing | None = None  # `key` and `value`


NO_PACKING = AttentionPacking()

# A function of one layer's head outputs (B, H, T_q, K), applied before the heads are
# concatenated and projected by W^O; it returns a tensor of the same shape. `HeadAblation`
# switches heads off; `minitfm.lab.ablate.HeadMeans` records their mean output.
HeadEdit = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class HeadAblation:
    """Heads of one attention layer switched off: each output head_h (before W^O) replaced.

    Zero ablation replaces head_h with 0, mean ablation with its mean over held-out data
    (the usual choice in interpretability work: the next layers see a vector of the usual scale).
    """

    off: Tensor  # (H,) bool, True = switched off
    value: Tensor  # (H, K): what a switched-off head outputs at every position

    def __call__(self, heads: Tensor) -> Tensor:
        off = self.off[:, None, None]  # (H, 1, 1)
        return torch.where(off, self.value[:, None, :], heads)  # (B, H, T_q, K)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017, §3.2.2: H heads of width K = D / H."""

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

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: AttentionPositions | None = None,
        edit: HeadEdit | None = None,
        packing: AttentionPacking | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from `query` (B, T_q, D) to `key`/`value` (B, T_k, D); returns output, weights.

        `positions` is set only for schemes that act inside attention (RoPE, ALiBi); `edit`
        (see `HeadEdit`) changes the head outputs before W^O, e.g. to ablate heads; `packing`
        says which inputs hold only their real tokens, (N, D) (the output is packed as `query`).
        """
        positions, packing = positions or NO_POSITIONS, packing or NO_PACKING
        q = self.q_proj(query)  # (B, T_q, D), or (N_q, D) packed
        if packing.queries is not None:
            q = packing.queries.unpack(q)  # (B, T_q, D), zeros at the padding
        B, T_q, D = q.shape
        q = self.split_heads(q)  # (B, H, T_q, K)
        if positions.queries is not None:
            q = positions.queries.rotate(q)  # (B, H, T_q, K), RoPE
        k, v = self.project_kv(key, value, cache, positions.keys, packing.keys)  # (B, H, T_k, K)
        out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout, positions.bias)
        if edit is not None:
            out = edit(out)  # (B, H, T_q, K)
        out = out.transpose(1, 2).reshape(B, T_q, D)  # (B, T_q, D): heads concatenated
        if packing.queries is not None:
            out = packing.queries.pack(out)  # (N_q, D)
        return self.out_proj(out), weights  # (B, T_q, D) or (N_q, D), (B, H, T_q, T_k)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, K): one slice of width K per head, each head's (T, K) matrix
        contiguous, as the batched matmuls of attention read them (copied once, here)."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2).contiguous()

    def project_kv(
        self, key: Tensor, value: Tensor, cache: KVCache | None, rotation: Rotation | None = None,
        packing: Packing | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Keys and values for this call, read from or written to `cache` when one is given."""
        if cache is not None and not cache.grow and cache.k is not None:
            return cache.k, cache.v  # cross-attention: the memory was projected at step 0
        k, v = self.k_proj(key), self.v_proj(value)  # (B, T_new, D), or (N_k, D) packed
        if packing is not None:
            k, v = packing.unpack(k), packing.unpack(v)  # (B, T_new, D), zeros at the padding
        k, v = self.split_heads(k), self.split_heads(v)  # (B, H, T_new, K) each
        if rotation is not None:  # RoPE: rotated before caching, so a cached key never changes
            k = rotation.rotate(k)  # (B, H, T_new, K)
        if cache is None:
            return k, v
        if not cache.grow:  # cross-attention, step 0: keep the memory's keys and values
            cache.k, cache.v = k, v
            return k, v
        return cache.append(k, v)  # (B, H, T_cached + T_new, K) each


class LayerNormFunction(torch.autograd.Function):
    """Layer norm with its backward written out: ~1.5x faster than autograd's on CPU.

    Forward, per position over its D features: x_hat = (X - mean) * rstd, rstd = 1/sqrt(s² + ε),
    Y = δ + γ ⊙ x_hat. Backward, with dY the incoming gradient and g = γ ⊙ dY:

        dγ = Σ_positions dY ⊙ x_hat,   dδ = Σ_positions dY
        dX = rstd (g - mean(g) - x_hat mean(g ⊙ x_hat))

    (x_hat depends on every X_j through the mean and s²; this is its Jacobian applied to g).
    The two means over features are matrix-vector products with γ: mean(g) = dY·γ / D and
    mean(g ⊙ x_hat) = (dY ⊙ x_hat)·γ / D, where dY ⊙ x_hat is dγ's product anyway.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)  # X - mean, (..., D)
        var = centred.square().mean(dim=-1, keepdim=True)  # s², the biased variance, (..., 1)
        rstd = (var + eps).rsqrt_()  # 1 / sqrt(s² + ε), (..., 1)
        x_hat = centred.mul_(rstd)  # (..., D)
        ctx.save_for_backward(x_hat, rstd, weight)
        return torch.addcmul(bias, x_hat, weight)  # δ + γ ⊙ x_hat, (..., D)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        x_hat, rstd, weight = ctx.saved_tensors
        D = grad.size(-1)
        grad_times_x_hat = grad * x_hat  # dY ⊙ x_hat, (..., D)
        grad_weight = grad_times_x_hat.reshape(-1, D).sum(dim=0)  # dγ, (D,)
        grad_bias = grad.reshape(-1, D).sum(dim=0)  # dδ, (D,)
        mean_g = (grad @ weight).unsqueeze(-1).div_(D)  # mean(g), (..., 1)
        proj = (grad_times_x_hat @ weight).unsqueeze(-1).div_(D)  # mean(g ⊙ x_hat), (..., 1)
        grad_x = torch.addcmul(mean_g.neg_(), grad, weight)  # g - mean(g), (..., D)
        grad_x.addcmul_(x_hat, proj, value=-1).mul_(rstd)  # dX, (..., D)
        return grad_x, grad_weight, grad_bias, None


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016, §3): γ (X - mean) / sqrt(s² + ε) + δ."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # γ, the gain
        self.bias = nn.Parameter(torch.zeros(d_model))  # δ, the shift

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each position's D features to mean 0 and variance 1, then scale and shift."""
        return LayerNormFunction.apply(x, self.weight, self.bias, self.eps)


class Dropout(nn.Module):
    """Dropout (Srivastava et al. 2014, §4): Z ⊙ X / (1 - p), Z ~ Bernoulli(1 - p)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        assert 0.0 <= p < 1.0, f"dropout p ({p}) must be in [0, 1)"
        self.p = p

    @property
    def active(self) -> bool:
        """Whether this dropout zeroes anything: in training, with p > 0."""
        return self.training and self.p > 0.0

    def scale(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """Z / (1 - p) of `shape`, Z ~ Bernoulli(1 - p), in `like`'s dtype and device.

        Z = 1[U >= p] for U ~ Uniform[0, 1) is Bernoulli(1 - p); on CPU one uniform draw and a
        comparison are ~2x faster than bernoulli_. Inverted scaling: divide by 1 - p now, so
        evaluation is the identity. Draws from torch's global RNG, which checkpoints save.
        """
        uniform = torch.rand(shape, dtype=like.dtype, device=like.device)
        return uniform.ge_(self.p).div_(1.0 - self.p)

    def forward(self, x: Tensor) -> Tensor:
        """Zero each element with probability p in training, scaling the rest to keep the mean."""
        if not self.active:
            return x
        return x * self.scale(x.shape, x)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class FeedForward(nn.Module):
    """Position-wise feed-forward, Vaswani et al. 2017, §3.3: Linear, ReLU, dropout, Linear.

    The dropout on the hidden layer is the tensor2tensor / Annotated Transformer variant
    (the paper's eq. 2 has none); nn.TransformerEncoderLayer does the same.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., F) -> (..., D), the same weights at every position."""
        hidden = torch.relu(self.linear1(x))  # (..., F)
        return self.linear2(self.dropout(hidden))
