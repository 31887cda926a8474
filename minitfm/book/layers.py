"""Layer norm, dropout and the feed-forward block (Vaswani et al. 2017, §3.3).

Written from tensor operations so each line can be read against the papers: Ba et al. 2016
§3 (layer norm, here with gain γ and shift δ); Srivastava et al. 2014 §4 (dropout with a
Bernoulli mask); Vaswani et al. 2017 §3.3 (feed-forward). Attention is in `attention.py`,
positional encodings in `positions.py`.

Shapes: D d_model, F d_ff; `...` any leading dims (batch, positions).

A user's values are checked by the config, with messages naming its keys; the asserts here
only state each primitive's own invariants (p in [0, 1)).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al. 2016, §3): γ (X - mean) / sqrt(s² + ε) + δ.

    Per position, over its D features: mean = Σ_i x_i / D and s² = Σ_i (x_i - mean)² / D, the
    biased variance (divided by D, not D - 1), as the paper and torch's layer norm define it.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # γ, the gain
        self.bias = nn.Parameter(torch.zeros(d_model))  # δ, the shift

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each position's D features to mean 0 and variance 1, then scale and shift."""
        centred = x - x.mean(dim=-1, keepdim=True)  # X - mean, (..., D)
        variance = centred.square().mean(dim=-1, keepdim=True)  # s², (..., 1)
        return self.weight * centred / (variance + self.eps).sqrt() + self.bias  # (..., D)


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

        Z = 1[U >= p] for U ~ Uniform[0, 1) is Bernoulli(1 - p). Inverted scaling: divide by
        1 - p now, so evaluation is the identity. Draws from torch's global RNG, which
        checkpoints save.
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
