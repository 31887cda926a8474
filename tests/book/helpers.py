"""What the book's tests share: float64 leaves, gradients of a fixed projection, masks."""

import torch

DTYPE = torch.float64


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
