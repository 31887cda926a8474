"""Attention and layer norm with their backward passes written out, and a short-row softmax.

The book's readable forms are `book.attention.attention` and `book.layers.LayerNorm.forward`;
these kernels compute the same (tested equal, values and gradients) with fewer passes over
memory: they keep fewer intermediates for backward and scale the smaller matrices. What that
buys on a CPU is measured in docs/speed.md.

Shapes: B batch, H n_heads, K d_head, D d_model; T_q and T_k are the query and key lengths of
one attention call.
"""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_(scores: Tensor) -> Tensor:
    """softmax over the last dim: exp(S - max S) / sum exp(S - max S), per row (in place for
    rows shorter than 16).

    Subtracting the row's max changes nothing in the result but keeps exp from overflowing;
    a row of only masked keys (all the lowest value) becomes uniform. torch's CPU softmax is
    one fast pass on rows of 16 keys or more, but slower than these four passes on shorter
    rows (decoding, short inputs), so those are written out (docs/speed.md).
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


class LayerNormFunction(torch.autograd.Function):
    """Layer norm with its backward written out, in fewer passes than autograd's (docs/speed.md).

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


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean mask (True = may attend) -> 0 where allowed, the dtype's lowest value elsewhere.

    Added to the scores, the lowest value swamps any score, so a masked key gets exp(min - max)
    = 0 exactly; unlike -inf, a row with every key masked becomes uniform instead of 0/0 = NaN.
    Adding costs one pass over the scores and nothing in backward (torch.where costs one each
    way), and the mask itself is small: (B, 1, 1, T_k) or (T_q, T_k).
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 bias: Tensor | None = None,
                                 keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`book.attention.attention` through `AttentionFunction`: (output, weights).

    The mask and ALiBi's `bias` become one additive term; `keep` is the dropout scale Z / (1 - p)
    of each weight (`book.layers.Dropout.scale`), None outside training.
    """
    additive = bias  # (B or 1, H, T_q, T_k) or None: whatever is added to the scores
    if mask is not None:
        masked = additive_mask(mask, q.dtype)  # (B, 1, 1, T_k) or (T_q, T_k)
        additive = masked if additive is None else additive + masked
    return AttentionFunction.apply(q, k, v, additive, keep)
