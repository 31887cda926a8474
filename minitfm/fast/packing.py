"""Packing: position-wise work on the real tokens of a padded batch only.

The projections, the feed-forward block and layer norm treat each position alone, so they can
skip the padding: the real tokens are packed into rows (N, ...) and unpacked to the padded grid
(B, T, ...) where attention needs it, whose masks hide the padding. What that saves on a batch
of mixed lengths is measured in docs/speed.md.

Shapes: B batch, T padded length, N real tokens in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Packing:
    """The real (non-PAD) tokens of a padded batch (B, T), packed into rows (N, ...).

    Position-wise work (the projections, the feed-forward block, layer norm) then skips the
    padding; attention unpacks to the padded grid, where its masks hide the padding.
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
        padded = x.new_zeros(self.B * self.T, *x.shape[1:])  # (B * T, ...)
        padded.index_copy_(0, self.index, x)
        return padded.view(self.B, self.T, *x.shape[1:])  # (B, T, ...)


@dataclass(frozen=True)
class AttentionPacking:
    """How one attention call's inputs are packed (None: padded, (B, T, D))."""

    queries: Packing | None = None  # `query`, and the output, which is packed alike
    keys: Packing | None = None  # `key` and `value`


NO_PACKING = AttentionPacking()  # frozen, so one shared instance is safe: nothing packed


def real_tokens(tokens: Tensor, pad_id: int) -> Packing | None:
    """Where the real (non-PAD) tokens of a batch (B, T) are; None when nothing is padding."""
    real = (tokens != pad_id).flatten()  # (B * T,)
    index = real.nonzero().squeeze(1)  # (N,)
    return Packing(index, *tokens.shape) if len(index) < len(real) else None
