"""Chapter 2's checks fail realistic wrong versions, each with the hint naming its mistake."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import minitfm.book.layers as book
from minitfm.learn.checks import layers as hints
from minitfm.learn.grading import check_function


def failed_with(name, function, hint):
    grade = check_function(name, function)
    assert grade.status == "failed" and hint in grade.hint, (grade.check, grade.message, grade.hint)


# --- layer norm ---

def norm_variant(unbiased=False, eps_outside=False, affine=True, dim=-1, keepdim=True):
    """The book's LayerNorm.forward with one thing done wrong."""
    def forward(self, x):
        mean = x.mean(dim=dim, keepdim=keepdim)
        centred = x - mean
        variance = x.var(dim=dim, keepdim=keepdim, unbiased=unbiased)
        if eps_outside:
            normed = centred / (variance.sqrt() + self.eps)
        else:
            normed = centred / (variance + self.eps).sqrt()
        return self.weight * normed + self.bias if affine else normed
    return forward


def annotated_transformer(self, x):
    """The Annotated Transformer's a_2 * (x - mean) / (std + eps) + b_2 (torch's std: unbiased)."""
    mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
    return self.weight * (x - mean) / (std + self.eps) + self.bias


def hard_coded_eps(self, x):
    return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, eps=1e-5)


@pytest.mark.parametrize("variant, hint", [
    (norm_variant(unbiased=True), "Bessel's correction"),
    (norm_variant(eps_outside=True), "eps is added outside the square root"),
    (norm_variant(affine=False), "the gain and the shift are missing"),
    (norm_variant(dim=-2), "normalised over the positions"),
    (norm_variant(dim=0), "normalised over the batch"),
    (norm_variant(keepdim=False), "keepdim=True"),
    (annotated_transformer, "Annotated Transformer"),
    (hard_coded_eps, "use the eps the module was made with"),
], ids=["bessel", "eps outside", "no gain or shift", "over positions", "over batch",
        "no keepdim", "std + eps", "eps 1e-5"])
def test_wrong_layer_norm_fails_with_its_hint(variant, hint):
    failed_with("LayerNorm.forward", variant, hint)


def test_layer_norm_without_the_shift_or_without_the_gain_is_named():
    def no_shift(self, x):
        return book.LayerNorm.forward(self, x) - self.bias

    def no_gain(self, x):
        return (book.LayerNorm.forward(self, x) - self.bias) / self.weight + self.bias

    failed_with("LayerNorm.forward", no_shift, hints.NO_SHIFT)
    failed_with("LayerNorm.forward", no_gain, hints.NO_GAIN)


def test_layer_norm_that_loses_the_gradient_fails():
    def forward(self, x):
        return book.LayerNorm.forward(self, x.detach())

    grade = check_function("LayerNorm.forward", forward)
    assert grade.status == "failed" and grade.check.startswith("gradients")


# --- dropout's mask ---

def mask_variant(scaled=True, keep_p=False, over_p=False, dtype=True, rand_like=False):
    """The book's Dropout.scale with one thing done wrong."""
    def scale(self, shape, like):
        draw = torch.rand_like(like) if rand_like else torch.rand(shape, dtype=like.dtype)
        keep = draw < self.p if keep_p else draw >= self.p
        mask = keep.to(like.dtype) if dtype else keep.float()
        if over_p:
            return mask / self.p
        return mask / (1 - self.p) if scaled else mask
    return scale


def numpy_mask(self, shape, like):
    keep = np.random.default_rng().random(shape) >= self.p
    return torch.tensor(keep, dtype=like.dtype) / (1 - self.p)


def own_generator(self, shape, like):
    uniform = torch.rand(shape, dtype=like.dtype, generator=torch.Generator())
    return uniform.ge_(self.p).div_(1 - self.p)


def boolean_mask(self, shape, like):
    return torch.rand(shape, dtype=like.dtype, device=like.device) >= self.p


def cpu_mask(self, shape, like):
    return torch.rand(shape, dtype=like.dtype).ge_(self.p).div_(1 - self.p)


@pytest.mark.parametrize("variant, hint", [
    (mask_variant(scaled=False), "not scaled by 1/(1-p)"),
    (mask_variant(over_p=True), "scaled by 1/p"),
    (mask_variant(keep_p=True), "zeroed, not p"),
    (mask_variant(dtype=False), "like's dtype"),
    (boolean_mask, "like's dtype"),
    (mask_variant(rand_like=True), "like's shape, not `shape`"),
    (numpy_mask, "torch's global RNG"),
    (own_generator, "every call draws the same mask"),
    (cpu_mask, "like's device"),
], ids=["unscaled", "1/p", "keep p", "float32", "bool", "rand_like", "numpy", "generator",
        "cpu"])
def test_wrong_dropout_mask_fails_with_its_hint(variant, hint):
    failed_with("Dropout.scale", variant, hint)


def test_an_equivalent_dropout_mask_passes():
    def scale(self, shape, like):
        keep = torch.full(shape, 1 - self.p, dtype=like.dtype, device=like.device)
        return torch.bernoulli(keep) / (1 - self.p)

    assert check_function("Dropout.scale", scale).status == "passed"


# --- the feed-forward block ---

def block_variant(relu=True, hidden_dropout=True, output_dropout=False, activation=None):
    """The book's FeedForward.forward with one thing done wrong."""
    def forward(self, x):
        hidden = self.linear1(x)
        if relu:
            hidden = (activation or torch.relu)(hidden)
        if hidden_dropout:
            hidden = self.dropout(hidden)
        out = self.linear2(hidden)
        return self.dropout(out) if output_dropout else out
    return forward


def torch_dropout(self, x):
    return self.linear2(F.dropout(torch.relu(self.linear1(x)), self.dropout.p))


def dropout_on_input(self, x):
    return self.linear2(torch.relu(self.linear1(self.dropout(x))))


def dropout_before_relu(self, x):
    return self.linear2(torch.relu(self.dropout(self.linear1(x))))


@pytest.mark.parametrize("variant, hint", [
    (block_variant(relu=False), "the ReLU is missing"),
    (block_variant(activation=F.gelu), "not GELU"),
    (block_variant(hidden_dropout=False), "the hidden layer's dropout is missing"),
    (block_variant(hidden_dropout=False, output_dropout=True), "dropout on the output"),
    (dropout_on_input, "dropout on the input"),
    (torch_dropout, "F.dropout"),
], ids=["no relu", "gelu", "no dropout", "dropout on output", "dropout on input", "F.dropout"])
def test_wrong_feed_forward_fails_with_its_hint(variant, hint):
    failed_with("FeedForward.forward", variant, hint)


def test_dropout_before_the_relu_is_the_same_block():
    assert check_function("FeedForward.forward", dropout_before_relu).status == "passed"


def test_feed_forward_with_dropout_on_in_evaluation_is_named():
    def mask_always(self, x):
        hidden = torch.relu(self.linear1(x))
        return self.linear2(hidden * self.dropout.scale(hidden.shape, hidden))

    def torch_dropout_by_mode(self, x):
        hidden = torch.relu(self.linear1(x))
        return self.linear2(F.dropout(hidden, self.dropout.p, training=self.training))

    failed_with("FeedForward.forward", mask_always, hints.DROPOUT_EVAL)
    failed_with("FeedForward.forward", torch_dropout_by_mode, "F.dropout")
