"""Checks of chapter 2, layers: `LayerNorm.forward`, `Dropout.scale`, `FeedForward.forward`.

Shapes: B batch, T positions, D d_model, F d_ff; `...` any leading dims.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitfm.book.layers import Dropout
from minitfm.learn.checks import DTYPE, Mismatch, Subject, expect, gradients, leaf

# --- layer norm ---

BESSEL = ("the variance has Bessel's correction (divided by D - 1): layer norm uses the biased "
          "variance, divided by D (unbiased=False, or the mean of the squared deviations)")
STD_PLUS_EPS = ("the Annotated Transformer's (x - mean) / (std + eps): take the biased variance "
                "(divide by D, not D - 1) and put eps inside the root, sqrt(variance + eps)")
EPS_OUTSIDE = "eps is added outside the square root: divide by sqrt(variance + eps)"
NO_EPS = "eps is missing: divide by sqrt(variance + self.eps)"
NO_GAIN = "the gain γ is missing: multiply by self.weight"
NO_SHIFT = "the shift δ is missing: add self.bias"
NO_AFFINE = "the gain and the shift are missing: multiply by self.weight, then add self.bias"
WRONG_DIM = ("take the mean and variance of each position's features, over the last dim "
             "(dim=-1, keepdim=True)")
KEEPDIM = ("keep the reduced dim: x.mean(dim=-1, keepdim=True) is (..., 1), which broadcasts "
           "against x (..., D)")


def normalised(x, dim=-1, correction: int = 0, eps: float = 0.1, outside: bool = False):
    """(x - mean) / sqrt(variance + eps) over `dim` (None: the whole tensor), or a wrong form."""
    dims = dim if dim is not None else tuple(range(x.dim()))
    centred = x - x.mean(dim=dims, keepdim=True)
    variance = x.var(dim=dims, keepdim=True, correction=correction)
    return centred / (variance.sqrt() + eps if outside else (variance + eps).sqrt())


def norm_wrong_outputs(x, weight, bias, eps: float) -> dict[str, torch.Tensor]:
    """The outputs of the usual layer norm mistakes, each named by its hint."""
    with torch.no_grad():
        right = normalised(x, eps=eps)
        wrong = {BESSEL: weight * normalised(x, correction=1, eps=eps) + bias,
                 STD_PLUS_EPS: weight * normalised(x, correction=1, eps=eps, outside=True) + bias,
                 EPS_OUTSIDE: weight * normalised(x, eps=eps, outside=True) + bias,
                 NO_EPS: weight * normalised(x, eps=0.0) + bias,
                 f"eps is not self.eps: use the eps the module was made with (here {eps})":
                     weight * normalised(x, eps=1e-5) + bias,  # torch's default, hard-coded
                 NO_GAIN: right + bias, NO_SHIFT: weight * right, NO_AFFINE: right}
        if x.dim() < 3:  # no other dim worth naming
            return wrong
        for dim, over in ((0, "the batch (dim 0)"), (-2, "the positions (dim -2)"),
                          (None, "the whole tensor")):
            wrong[f"normalised over {over}: {WRONG_DIM}"] = \
                weight * normalised(x, dim, eps=eps) + bias
    return wrong


def make_norm(s: Subject, d_model: int, eps: float = 0.1):
    """The learner's LayerNorm (float64) with a gain and a shift that are not 1 and 0."""
    norm = s.owner()(d_model, eps=eps).to(DTYPE)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(d_model, dtype=DTYPE, generator=generator))
        norm.bias.copy_(torch.randn(d_model, dtype=DTYPE, generator=generator))
    return norm


def call_norm(norm, x):
    """norm(x), with a broadcasting error read as a lost keepdim."""
    try:
        return norm(x)
    except RuntimeError as err:
        if "must match the size" in str(err):
            raise Mismatch(f"RuntimeError: {err}", KEEPDIM) from err
        raise


def layer_norm_matches_torch(s: Subject) -> None:
    """values over the last dim, with a gain, a shift and eps 0.1, against torch's layer_norm"""
    norm = make_norm(s, 5)
    x = leaf(2, 3, 5)  # (B, T, D)
    expected = F.layer_norm(x, (5,), norm.weight, norm.bias, eps=0.1)
    expect(call_norm(norm, x), expected, "the output (B, T, D)",
           norm_wrong_outputs(x, norm.weight, norm.bias, 0.1))


def layer_norm_gradients(s: Subject) -> None:
    """gradients of x, the gain and the shift, against torch's layer_norm"""
    norm = make_norm(s, 5)
    x = leaf(2, 3, 5, seed=1)
    out = call_norm(norm, x)
    expected = F.layer_norm(x, (5,), norm.weight, norm.bias, eps=0.1)
    inputs = [x, norm.weight, norm.bias]
    got, want = gradients(out, inputs), gradients(expected, inputs)
    for name, g, w in zip(("x", "the gain (weight)", "the shift (bias)"), got, want, strict=True):
        if g is None:
            raise Mismatch(f"no gradient reaches {name}", "compute with tensor operations only "
                           "(no .detach(), .item() or .data on the way), and use self.weight "
                           "and self.bias")
        expect(g, w, f"the gradient of {name}")


def layer_norm_any_shape(s: Subject) -> None:
    """one vector (D,), four dims (2, 1, 3, D), and a constant position (variance 0)"""
    norm = make_norm(s, 6, eps=1e-5)
    for x, what in ((leaf(6, seed=2), "the output for one vector (D,)"),
                    (leaf(2, 1, 3, 6, seed=3), "the output for (2, 1, 3, D)")):
        expected = F.layer_norm(x, (6,), norm.weight, norm.bias, eps=1e-5)
        expect(call_norm(norm, x), expected, what,
               norm_wrong_outputs(x, norm.weight, norm.bias, 1e-5),
               hint="normalise over the last dim only, whatever the leading dims")
    constant = torch.full((2, 6), 3.0, dtype=DTYPE)
    expect(call_norm(norm, constant), norm.bias.detach().expand(2, 6),
           "the output for a constant position", {
               NO_EPS: torch.full((2, 6), float("nan"), dtype=DTYPE)},
           hint="a constant position has variance 0: (x - mean) is 0, so the output is the shift")


# --- dropout's mask ---

UNSCALED = ("kept values not scaled by 1/(1-p): divide the kept ones by 1 - p, so that x times "
            "the mask keeps x's mean (inverted dropout: evaluation is then the identity)")
OVER_P = ("kept values scaled by 1/p: p is the probability of zeroing, so the kept ones, with "
          "probability 1 - p, are divided by 1 - p")
KEEP_P = ("about 1 - p of the values are zeroed, not p: keep where the uniform draw is >= p "
          "(torch.rand(shape) >= p is True with probability 1 - p)")
LIKE_DTYPE = ("make the mask in like's dtype: torch.rand(shape, dtype=like.dtype, "
              "device=like.device), and turn a boolean mask into numbers with .to(like.dtype)")
LIKE_DEVICE = ("make the mask on like's device: torch.rand(shape, dtype=like.dtype, "
               "device=like.device); a mask on the CPU cannot multiply a tensor on the GPU")
LIKE_SHAPE = ("the mask has like's shape, not `shape`: draw torch.rand(shape, ...); like only "
              "gives the dtype and device (the appendix asks for masks of other shapes)")
GLOBAL_RNG = ("draw from torch's global RNG (torch.rand, with no generator; not random or "
              "numpy): torch.manual_seed must repeat a run's masks, and checkpoints save it")
SAME_EVERY_CALL = ("every call draws the same mask: draw from torch's global RNG, not from a "
                   "generator made afresh (and so seeded alike) each call")


def draw(dropout, shape: tuple[int, ...], like) -> torch.Tensor:
    """The learner's mask of `shape` for `like`, of that shape and like's dtype."""
    mask = dropout.scale(shape, like)
    if not isinstance(mask, torch.Tensor):
        raise Mismatch(f"scale returned a {type(mask).__name__}, not a tensor",
                       "return the mask Z / (1 - p) as a tensor")
    if mask.shape != shape:
        raise Mismatch(f"the mask has shape {tuple(mask.shape)}, asked for {shape}",
                       LIKE_SHAPE if mask.shape == like.shape else "draw a mask of `shape`")
    if mask.dtype != like.dtype:
        raise Mismatch(f"the mask is {mask.dtype}, like {like.dtype}", LIKE_DTYPE)
    return mask


def dropout_mask_values(s: Subject) -> None:
    """a mask of `shape` in like's dtype, each value 0 or 1/(1-p) (p = 0.2: 0 or 1.25)"""
    like = leaf(3, 4, seed=4)  # not the mask's shape: like gives only its dtype and device
    mask = draw(s.owner()(0.2), (3, 7, 50), like)
    kept = mask[mask != 0]
    for value, hint in ((1.25, ""), (1.0, UNSCALED), (5.0, OVER_P)):
        if len(kept) and bool(torch.allclose(kept, torch.full_like(kept, value))):
            if hint:
                raise Mismatch(f"the kept values are {value}, expected 1/(1 - 0.2) = 1.25", hint)
            return
    raise Mismatch(f"the kept values range over {kept.min().item() if len(kept) else 0:.3g}.."
                   f"{kept.max().item() if len(kept) else 0:.3g}, expected all 1/(1 - 0.2) = "
                   f"1.25", "the mask is Z / (1 - p): 1 / (1 - p) where kept, 0 where dropped")


def dropout_rate(s: Subject) -> None:
    """about p of the values are zeroed, for p = 0.2 and p = 0.6 (1,000 draws each)"""
    like = torch.zeros(1, dtype=DTYPE)
    for p in (0.2, 0.6):
        zeroed = (draw(s.owner()(p), (4, 250), like) == 0).double().mean().item()
        if abs(zeroed - p) > 0.06:  # 4 standard deviations or more
            hint = KEEP_P if abs(zeroed - (1 - p)) <= 0.06 else \
                "zero each value with probability p: keep where torch.rand(shape) >= p"
            raise Mismatch(f"with p = {p}, {zeroed:.0%} of the mask is zero", hint)


def dropout_global_rng(s: Subject) -> None:
    """a draw from torch's global RNG: torch.manual_seed repeats a mask, the next call differs"""
    dropout, like = s.owner()(0.5), torch.zeros(1, dtype=DTYPE)
    torch.manual_seed(11)
    first = draw(dropout, (6, 8), like)
    torch.manual_seed(11)
    again = draw(dropout, (6, 8), like)
    following = draw(dropout, (6, 8), like)
    if not torch.equal(first, again):
        raise Mismatch("after torch.manual_seed(11), twice, two different masks", GLOBAL_RNG)
    if torch.equal(again, following):
        raise Mismatch("two calls in a row drew the same mask", SAME_EVERY_CALL)


def dropout_device(s: Subject) -> None:
    """the mask is made on like's device (the GPU if there is one, else the meta device)"""
    device = torch.device("cuda" if torch.cuda.is_available() else "meta")
    like = torch.empty(2, 3, dtype=DTYPE, device=device)
    try:
        mask = s.owner()(0.5).scale((2, 3), like)
    except (NotImplementedError, RuntimeError):
        if device.type == "meta":  # code that cannot run on a tensor without values:
            return  # its device cannot be judged here
        raise
    if isinstance(mask, torch.Tensor) and mask.device.type != device.type:
        raise Mismatch(f"the mask is on {mask.device}, like on {device}", LIKE_DEVICE)


# --- the feed-forward block ---

NO_RELU = "the ReLU is missing: linear2(dropout(relu(linear1(x))))"
GELU = "the paper's block uses ReLU (torch.relu), not GELU"
RELU_OUT = "a ReLU on the output too: only the hidden layer goes through ReLU"
NO_DROPOUT = ("the hidden layer's dropout is missing: self.dropout(hidden) between the ReLU and "
              "linear2")
DROPOUT_OUT = ("dropout on the output: it goes on the hidden layer, between the ReLU and "
               "linear2 (the model's residual connection drops the block's output itself)")
DROPOUT_IN = "dropout on the input: it goes on the hidden layer, between the ReLU and linear2"
DROPOUT_EVAL = ("dropout is applied in evaluation: call self.dropout(hidden), the module, which "
                "is the identity in eval mode")
F_DROPOUT = ("use self.dropout, the book's module: F.dropout draws its mask another way, and "
             "its training argument is True unless given")


def make_block(s: Subject, dropout: float = 0.5):
    """The learner's FeedForward, D 5 and F 7, float64 (nn.Linear's init: the seeded RNG)."""
    return s.owner()(5, 7, dropout).to(DTYPE)


def reference(block, x, where: str = "", seed: int = 5):
    """linear2(relu(linear1(x))), with the book's dropout mask (drawn after `seed`) on the
    input, hidden layer or output (`where`), or torch's F.dropout on the hidden layer."""
    def drop(t, at):
        torch.manual_seed(seed)
        if where == "F.dropout" and at == "hidden":
            return F.dropout(t, block.dropout.p)
        return t * Dropout(block.dropout.p).scale(t.shape, t) if where == at else t

    with torch.no_grad():
        hidden = F.relu(F.linear(drop(x, "input"), block.linear1.weight, block.linear1.bias))
        out = F.linear(drop(hidden, "hidden"), block.linear2.weight, block.linear2.bias)
        return drop(out, "output")  # (..., D)


def feed_forward_matches_torch(s: Subject) -> None:
    """in evaluation: linear2(relu(linear1(x))) for x (B, T, D) and (D,), against F.linear"""
    block = make_block(s).eval()
    for x in (leaf(2, 3, 5), leaf(5, seed=1)):
        torch.manual_seed(5)
        out = block(x)
        with torch.no_grad():
            w1, b1, w2, b2 = (block.linear1.weight, block.linear1.bias, block.linear2.weight,
                              block.linear2.bias)
            wrong = {NO_RELU: F.linear(F.linear(x, w1, b1), w2, b2),
                     GELU: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),
                     RELU_OUT: F.relu(reference(block, x)),
                     DROPOUT_EVAL: reference(block, x, "hidden"),
                     F_DROPOUT: reference(block, x, "F.dropout")}
        expect(out, reference(block, x), f"the output for x {tuple(x.shape)}", wrong,
               hint="linear1, ReLU, dropout on the hidden layer, linear2")


def feed_forward_dropout(s: Subject) -> None:
    """in training (p = 0.5): self.dropout on the hidden layer, between the ReLU and linear2"""
    block = make_block(s).train()
    x = leaf(2, 3, 5)
    torch.manual_seed(5)
    out = block(x)
    wrong = {NO_DROPOUT: reference(block, x), DROPOUT_OUT: reference(block, x, "output"),
             DROPOUT_IN: reference(block, x, "input"), F_DROPOUT: reference(block, x, "F.dropout")}
    expect(out, reference(block, x, "hidden"), "the output in training", wrong,
           hint="linear1, ReLU, self.dropout on the hidden layer, linear2")


def feed_forward_gradients(s: Subject) -> None:
    """gradients of x and of both layers' weights, against F.linear and F.relu"""
    block = make_block(s).eval()
    x = leaf(2, 3, 5, seed=2)
    out = block(x)
    w1, b1, w2, b2 = block.linear1.weight, block.linear1.bias, block.linear2.weight, \
        block.linear2.bias
    expected = F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)
    inputs = [x, w1, w2]
    for name, got, want in zip(("x", "linear1.weight", "linear2.weight"),
                               gradients(out, inputs), gradients(expected, inputs), strict=True):
        if got is None:
            raise Mismatch(f"no gradient reaches {name}", "use self.linear1 and self.linear2, "
                           "with tensor operations only (no .detach() or .data)")
        expect(got, want, f"the gradient of {name}")


CHECKS = {
    "LayerNorm.forward": (layer_norm_matches_torch, layer_norm_gradients, layer_norm_any_shape),
    "Dropout.scale": (dropout_mask_values, dropout_rate, dropout_global_rng, dropout_device),
    "FeedForward.forward": (feed_forward_matches_torch, feed_forward_dropout,
                            feed_forward_gradients),
}
