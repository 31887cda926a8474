"""AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2),
written out over one flat vector that holds every parameter.

For each step t, with gradient g, learning rate η (the schedule's), β1, β2, ε, and weight
decay λ on the weight matrices only (not on biases or the norms' γ and δ):

    θ ← θ − η λ θ                                   decoupled weight decay
    m ← β1 m + (1 − β1) g                           first moment, a running mean of g
    v ← β2 v + (1 − β2) g²                          second moment, a running mean of g²
    θ ← θ − η m / (1 − β1^t) / (sqrt(v / (1 − β2^t)) + ε)   bias-corrected update

The parameters are views into one flat tensor, so a step is a few operations on one long
vector instead of a loop over ~50 small tensors (torch's fused AdamW does the same in C++).
Gradient clipping (the global norm, as `torch.nn.utils.clip_grad_norm_`) happens on the same
flat vector.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


class AdamW:
    """AdamW over `model`'s parameters, which become views into one flat tensor.

    Make it after the model is on its device (moving the model afterwards would break the
    views). Set `lr` before each `step` (the schedule is the training loop's).
    """

    def __init__(self, model: nn.Module, lr: float, weight_decay: float,
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-8):
        self.params = list(model.parameters())  # tied weights appear once
        self.lr, self.betas, self.eps = lr, betas, eps
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])  # θ, (N,)
        self.starts, offset = {}, 0  # where each parameter starts in the flat vector
        for p in self.params:
            self.starts[p], offset = offset, offset + p.numel()
            p.data = self.flat[self.starts[p]:offset].view_as(p)
        # λ where the parameter is a matrix (>= 2 dims), 0 for biases and norms: (N,)
        self.decay = torch.cat([torch.full((p.numel(),), weight_decay if p.dim() >= 2 else 0.0,
                                           dtype=self.flat.dtype, device=self.flat.device)
                                for p in self.params])
        self.exp_avg = torch.zeros_like(self.flat)  # m, (N,)
        self.exp_avg_sq = torch.zeros_like(self.flat)  # v, (N,)
        self.t = 0

    def zero_grad(self) -> None:
        """Forget the gradients (backward then writes fresh ones)."""
        for p in self.params:
            p.grad = None

    def gradient(self) -> Tensor:
        """Every parameter's gradient in one flat vector, zeros where there is none: (N,)."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])

    @torch.no_grad()
    def step(self, max_norm: float | None = None) -> Tensor:
        """One update from the parameters' gradients, clipped to `max_norm` (None: not
        clipped); returns the gradient norm before clipping (a 0-dim tensor, not read)."""
        g = self.gradient()  # (N,)
        norm = torch.linalg.vector_norm(g)
        if max_norm is not None:  # g · min(1, max_norm / ‖g‖), as clip_grad_norm_
            g.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        self.t += 1
        beta1, beta2 = self.betas
        self.flat.addcmul_(self.flat, self.decay, value=-self.lr)  # θ − η λ θ
        self.exp_avg.lerp_(g, 1 - beta1)  # m
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v
        correction1, correction2 = 1 - beta1**self.t, 1 - beta2**self.t
        denominator = (self.exp_avg_sq.sqrt() / math.sqrt(correction2)).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg, denominator, value=-self.lr / correction1)
        return norm

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.t, "exp_avg": self.exp_avg.clone(),
                "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the moments and step count saved by `state_dict`."""
        for name in ("exp_avg", "exp_avg_sq"):
            saved = state[name]
            if not isinstance(saved, Tensor) or saved.shape != self.flat.shape:
                raise ValueError(f"optimizer {name} has shape {getattr(saved, 'shape', None)}, "
                                 f"the model {tuple(self.flat.shape)}")
            getattr(self, name).copy_(saved)
        self.t = int(state["step"])
