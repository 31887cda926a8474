"""Chapter 2: layer norm, dropout and the feed-forward block against PyTorch's own."""

import pytest
import torch
import torch.nn.functional as F

from minitfm.book.layers import Dropout, FeedForward, LayerNorm
from tests.book.helpers import DTYPE, assert_all_close, grads

# Layer norm


@pytest.mark.parametrize("shape", [(8,), (4, 8), (3, 5, 8)])
def test_layer_norm_matches_reference(shape):
    norm = LayerNorm(8).to(DTYPE)
    with torch.no_grad():  # non-trivial γ and δ, so their gradients are checked too
        norm.weight.copy_(torch.randn(8, dtype=DTYPE))
        norm.bias.copy_(torch.randn(8, dtype=DTYPE))
    x = (torch.randn(shape, dtype=DTYPE) * 3 + 1).requires_grad_()
    ours = norm(x)
    ref = F.layer_norm(x, (8,), norm.weight, norm.bias, eps=1e-5)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
    params = (x, norm.weight, norm.bias)
    assert_all_close(grads(ours, params), grads(ref, params), atol=1e-12)


def test_layer_norm_normalises_with_biased_variance():
    y = LayerNorm(16)(torch.randn(4, 16) * 5 + 3)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(4), atol=1e-3, rtol=0)


# Dropout and feed-forward


def test_dropout_is_identity_in_eval_and_for_zero_p():
    x = torch.randn(100)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_dropout_zeroes_about_p_and_keeps_the_mean():
    p = 0.3
    y = Dropout(p).train()(torch.ones(1_000_000))
    assert abs((y == 0).float().mean().item() - p) < 0.005
    assert abs(y.mean().item() - 1.0) < 0.01
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))  # inverted scaling


def test_dropout_uses_the_global_rng():
    x = torch.ones(1000)
    torch.manual_seed(5)
    a = Dropout(0.5).train()(x)
    torch.manual_seed(5)
    b = Dropout(0.5).train()(x)
    assert torch.equal(a, b)


def test_dropout_rejects_p_of_one():
    with pytest.raises(AssertionError, match=r"dropout p \(1.0\) must be in \[0, 1\)"):
        Dropout(1.0)


def test_feed_forward_is_linear_relu_linear():
    ff = FeedForward(4, 16).to(DTYPE)
    x = torch.randn(2, 3, 4, dtype=DTYPE)
    expected = F.linear(torch.relu(F.linear(x, ff.linear1.weight, ff.linear1.bias)),
                        ff.linear2.weight, ff.linear2.bias)
    torch.testing.assert_close(ff(x), expected)
