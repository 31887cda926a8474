"""Checks of chapter 4, the model: `subsequent_mask`, `EncoderLayer.forward`,
`DecoderLayer.forward`, and `greedy_decode` (its checks in `decoding.py`).

The layers are compared with PyTorch's nn.TransformerEncoderLayer and nn.TransformerDecoderLayer
holding the same weights, pre-LN and post-LN, with padding and causal masks, values and
gradients; the decoder layer also step by step with its KV caches, against one causal pass.
Known wrong versions (a residual missing, the norms mixed up, ...) are run with the same weights
to name the likely mistake.

Shapes: B batch, S source len, T target len, D d_model, H n_heads.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

from minitfm.book.attention import EVERY_KEY, AttentionScope
from minitfm.book.layers import Dropout
from minitfm.book.model import DecoderLayer, DecoderLayerCache, EncoderLayer
from minitfm.config import ModelConfig
from minitfm.learn.checks import DTYPE, Mismatch, Subject, decoding, expect, gradients, leaf

# --- the causal mask ---

LEAKS = ("a position sees the one after it: the diagonal is off by one (tril(diagonal=1)); "
         "True on and below the diagonal is tril's default, diagonal=0")
NO_SELF = ("a position does not see itself: tril(diagonal=-1) leaves the diagonal out; keep "
           "diagonal=0")
TRANSPOSED = ("True above the diagonal: each position sees the future and not the past; take "
              "torch.tril, not torch.triu")
FLIPPED = ("True where a position may not look (nn.Transformer's convention); here True means "
           "\"may attend\": True on and below the diagonal")
ADDITIVE = ("a float mask of 0 and -inf, added to the scores, is nn.Transformer's form; here "
            "the mask is boolean, True where a position may attend (on and below the diagonal)")
NOT_BOOL = ("make the mask boolean (dtype=torch.bool): attention hides the keys where ~mask, "
            "and ~ of a number is not \"not\"")


def mask_values(s: Subject) -> None:
    """True on and below the diagonal (position i sees j <= i), for sizes 5, 1 and 8"""
    for size in (5, 1, 8):
        got = s(size)
        if isinstance(got, Tensor) and got.is_floating_point() and got.isinf().any():
            raise Mismatch(f"subsequent_mask({size}) holds -inf: an additive mask", ADDITIVE)
        ones = torch.ones(size, size, dtype=DTYPE)
        wrong = {LEAKS: ones.tril(1), NO_SELF: ones.tril(-1), TRANSPOSED: ones.triu(),
                 FLIPPED: ones.triu(1)}
        actual = (got != 0).to(DTYPE) if isinstance(got, Tensor) else got
        expect(actual, ones.tril(), f"subsequent_mask({size})", wrong,
               hint=f"a ({size}, {size}) matrix: a row per query position, a column per key")


def mask_dtype_and_device(s: Subject) -> None:
    """a boolean mask (torch.bool), made on the device asked for"""
    got = s(4)
    if got.dtype != torch.bool:
        raise Mismatch(f"subsequent_mask(4) is {got.dtype}, not torch.bool", NOT_BOOL)
    got = s(3, device="meta")
    if got.device.type != "meta":
        raise Mismatch(f"subsequent_mask(3, device='meta') is on {got.device}, not on meta (a "
                       "device without data, standing in here for a GPU)",
                       "make it on `device`: torch.ones(size, size, dtype=torch.bool, "
                       "device=device)")


# --- the encoder and decoder layers ---

D, HEADS, D_FF = 8, 2, 16

NORM_FIRST = ("norm_first is not followed: pre-LN (norm_first) normalises each sub-layer's "
              "input, x + dropout(sublayer(norm(x))); post-LN normalises after the residual "
              "sum, norm(x + dropout(sublayer(x)))")
NORMED_RESIDUAL = ("the residual adds norm(x): in pre-LN the sum is x + "
                   "dropout(sublayer(norm(x))), with x itself")
POST_LN_INSIDE = ("post-LN normalises the residual sum, not the sub-layer's output: norm(x + "
                  "dropout(sublayer(x))), not x + norm(sublayer(x))")
POST_LN_BEFORE = ("post-LN normalises after the residual sum, not before: norm(x + "
                  "dropout(sublayer(x))); normalising x first and adding the normalised x back "
                  "is neither post-LN nor pre-LN")
NO_PADDING = "the padding mask is not applied: pass scope to self_attn"
NO_CAUSAL = ("the causal mask is not applied: pass self_scope to self_attn (a position must not "
             "see later ones)")
NO_CROSS_MASK = ("the source padding mask is not applied in cross-attention: pass cross_scope "
                 "to cross_attn")
SCOPES_SWAPPED = ("the scopes are swapped: self_scope (the causal mask) goes to self_attn, "
                  "cross_scope (the source padding) to cross_attn")
CROSS_X = ("cross-attention reads x instead of memory: queries come from x, keys and values "
           "from the encoder's memory, cross_attn(h, memory, memory, cross_scope, ...)")
NO_DROPOUT = ("dropout on each sub-layer's output is missing: x + self.dropout(sublayer(...)) "
              "(§5.4)")
DROPOUT_PLACE = ("apply self.dropout to each sub-layer's output (not to the sum), in the book's "
                 "order of sub-layers")
NONE_CACHE = ("cache may be None (in training, and decoding without a cache): pass None to both "
              "sub-layers then")
ENCODER_NORMS = "norm1 goes with self-attention, norm2 with the feed-forward block"
DECODER_NORMS = ("norm1 goes with self-attention, norm2 with cross-attention, norm3 with the "
                 "feed-forward block")


def no_residual(name: str) -> str:
    return f"the {name} sub-layer has no residual: add its input back, x + dropout(sublayer(...))"


def mixed(order: tuple[int, ...], rule: str) -> str:
    names = ", ".join(f"norm{i + 1}" for i in order)
    return f"the norms are mixed up ({names}, in that order): {rule}"


def config(norm_first: bool, dropout: float = 0.0) -> ModelConfig:
    return ModelConfig(d_model=D, n_heads=HEADS, d_ff=D_FF, norm_first=norm_first,
                       dropout=dropout)


def load_reference(ours: nn.Module, ref: nn.Module) -> None:
    """Randomise torch's layer and copy its weights into ours, under the book's names."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype, generator=generator) * 0.3)
        pairs = [(ours.self_attn, ref.self_attn)]
        if hasattr(ref, "multihead_attn"):
            pairs.append((ours.cross_attn, ref.multihead_attn))
        for mine, theirs in pairs:
            for proj, w, b in zip((mine.q_proj, mine.k_proj, mine.v_proj),
                                  theirs.in_proj_weight.chunk(3), theirs.in_proj_bias.chunk(3),
                                  strict=True):
                proj.weight.copy_(w)
                proj.bias.copy_(b)
            mine.out_proj.load_state_dict(theirs.out_proj.state_dict())
        ours.feed_forward.linear1.load_state_dict(ref.linear1.state_dict())
        ours.feed_forward.linear2.load_state_dict(ref.linear2.state_dict())
        for name in ("norm1", "norm2", "norm3"):
            if hasattr(ref, name):
                getattr(ours, name).load_state_dict(getattr(ref, name).state_dict())


def paired_layer(s: Subject, norm_first: bool) -> tuple[nn.Module, nn.Module]:
    """The learner's layer and torch's, with the same weights. Torch's runs in training mode
    (its dropout is 0), where it takes no fast path."""
    owner = s.owner()
    ours = owner(config(norm_first)).to(DTYPE)
    kind = nn.TransformerDecoderLayer if issubclass(owner, DecoderLayer) \
        else nn.TransformerEncoderLayer
    ref = kind(D, HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref = ref.to(DTYPE).train()
    load_reference(ours, ref)
    return ours, ref


def book_twin(ours: nn.Module) -> nn.Module:
    """The book's layer with the learner's layer's weights and mode."""
    book_class = DecoderLayer if isinstance(ours, DecoderLayer) else EncoderLayer
    cfg = config(ours.norm_first, ours.dropout.p)
    twin = book_class(cfg).to(DTYPE).train(ours.training)
    twin.load_state_dict(ours.state_dict())
    return twin


def returned(result, n: int, what: str) -> tuple:
    if not isinstance(result, tuple) or len(result) != n:
        raise Mismatch(f"{what} returned {type(result).__name__}, not a tuple of {n}",
                       "return what the book's docstring says: the new x, then the weights")
    return result


def keeping(lengths: tuple[int, ...], S: int) -> Tensor:
    """The padding mask (B, S) of rows of these lengths: True on real tokens."""
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)


def residual(x: Tensor, sublayer, norm, norm_first: bool, how: str = "") -> Tensor:
    """One residual sub-layer, pre-LN or post-LN, or with the mistake `how`: no residual, the
    normalised x added back ("normed"), post-LN's norm on the sub-layer's output ("inside") or
    on x before it ("before")."""
    if how == "inside":
        return x + norm(sublayer(x))
    pre = norm_first or how == "before"
    h = norm(x) if pre else x
    out = sublayer(h)
    total = out if how == "no residual" else (h if how in ("normed", "before") else x) + out
    return total if pre else norm(total)


def usual_mistakes(run, names: tuple[str, ...], norm_first: bool, rule: str) -> dict:
    """The outputs of the mistakes both layers invite, each named by its hint: `run` runs the
    layer's sub-layers in turn with a norm order, a mistake per sub-layer, or LN flipped."""
    n = len(names)
    wrong = {NORM_FIRST: run(norm_first=not norm_first)}
    for i, name in enumerate(names):
        wrong[no_residual(name)] = run(hows=tuple("no residual" if j == i else ""
                                                  for j in range(n)))
    for order in itertools.product(range(n), repeat=n):
        if order != tuple(range(n)):
            wrong[mixed(order, rule)] = run(order=order)
    if norm_first:
        wrong[NORMED_RESIDUAL] = run(hows=("normed",) * n)
    else:
        wrong[POST_LN_INSIDE] = run(hows=("inside",) * n)
        wrong[POST_LN_BEFORE] = run(hows=("before",) * n)
    return wrong


def sublayers_runner(x: Tensor, sublayers: tuple, norms: tuple, norm_first: bool):
    """`run(subs, order, hows, norm_first)`: x through the sub-layers, each residual."""
    def run(subs=sublayers, order=tuple(range(len(norms))), hows=("",) * len(norms),
            norm_first=norm_first):
        with torch.no_grad():
            y = x
            for sublayer, i, how in zip(subs, order, hows, strict=True):
                y = residual(y, sublayer, norms[i], norm_first, how)
            return y
    return run


def encoder_wrong(layer: nn.Module, x: Tensor, scope: AttentionScope) -> dict:
    """The outputs of the usual mistakes in an encoder layer, each named by its hint."""
    def attend(sc):
        return lambda h: layer.self_attn(h, h, h, sc)[0]

    run = sublayers_runner(x, (attend(scope), layer.feed_forward), (layer.norm1, layer.norm2),
                           layer.norm_first)
    wrong = usual_mistakes(run, ("self-attention", "feed-forward"), layer.norm_first,
                           ENCODER_NORMS)
    wrong[NO_PADDING] = run(subs=(attend(EVERY_KEY), layer.feed_forward))
    return wrong


def decoder_wrong(layer: nn.Module, x: Tensor, memory: Tensor, scopes: tuple) -> dict:
    """The outputs of the usual mistakes in a decoder layer (x and memory of one length, so
    that attending to x in place of memory is a mistake that runs)."""
    self_scope, cross_scope = scopes

    def attend(sc):
        return lambda h: layer.self_attn(h, h, h, sc)[0]

    def cross(sc, from_x=False):
        return lambda h: layer.cross_attn(h, *((h, h) if from_x else (memory, memory)), sc)[0]

    ff = layer.feed_forward
    run = sublayers_runner(x, (attend(self_scope), cross(cross_scope), ff),
                           (layer.norm1, layer.norm2, layer.norm3), layer.norm_first)
    wrong = usual_mistakes(run, ("self-attention", "cross-attention", "feed-forward"),
                           layer.norm_first, DECODER_NORMS)
    wrong.update({CROSS_X: run(subs=(attend(self_scope), cross(cross_scope, from_x=True), ff)),
                  SCOPES_SWAPPED: run(subs=(attend(cross_scope), cross(self_scope), ff)),
                  NO_CAUSAL: run(subs=(attend(EVERY_KEY), cross(cross_scope), ff)),
                  NO_CROSS_MASK: run(subs=(attend(self_scope), cross(EVERY_KEY), ff))})
    return wrong


def style(norm_first: bool) -> str:
    return "pre-LN" if norm_first else "post-LN"


def encoder_against_torch(s: Subject, norm_first: bool) -> None:
    ours, ref = paired_layer(s, norm_first)
    x, keep = leaf(2, 5, D), keeping((5, 3), 5)
    scope = AttentionScope(keep[:, None, None, :])  # (B, 1, 1, S)
    out, weights = returned(ours(x, scope), 2, f"EncoderLayer ({style(norm_first)})")
    expected = ref(x, src_key_padding_mask=~keep)
    expect(out, expected, f"the output ({style(norm_first)})", encoder_wrong(ours, x, scope))
    expect(weights, book_twin(ours)(x, scope)[1], "the self-attention weights (B, H, S, S)",
           hint="return the weights that self_attn returns")


def encoder_pre_ln(s: Subject) -> None:
    """pre-LN (norm_first=True) with a padding mask, against nn.TransformerEncoderLayer"""
    encoder_against_torch(s, True)


def encoder_post_ln(s: Subject) -> None:
    """post-LN (norm_first=False) with a padding mask, against nn.TransformerEncoderLayer"""
    encoder_against_torch(s, False)


def compare_gradients(out: Tensor, expected: Tensor, ours: list, theirs: list,
                      names: list[str]) -> None:
    for name, got, want in zip(names, gradients(out, ours), gradients(expected, theirs),
                               strict=True):
        if got is None:
            raise Mismatch(f"no gradient reaches {name}", "compute with tensor operations only "
                           "(no .detach(), .item() or .data on the way)")
        expect(got, want, f"the gradient of {name}")


def encoder_gradients(s: Subject) -> None:
    """gradients of x and of the weights, pre-LN and post-LN, against nn.TransformerEncoderLayer"""
    for norm_first in (True, False):
        ours, ref = paired_layer(s, norm_first)
        x, keep = leaf(2, 6, D, seed=4), keeping((6, 2), 6)
        out = returned(ours(x, AttentionScope(keep[:, None, None, :])), 2, "EncoderLayer")[0]
        expected = ref(x, src_key_padding_mask=~keep)
        compare_gradients(out, expected, [x, ours.self_attn.out_proj.weight, ours.norm1.weight,
                                          ours.feed_forward.linear1.weight],
                          [x, ref.self_attn.out_proj.weight, ref.norm1.weight,
                           ref.linear1.weight],
                          ["x", "self_attn.out_proj.weight", "norm1.weight", "linear1.weight"])


def with_dropout(s: Subject, call) -> None:
    """In training, the learner's layer draws dropout as the book's does: `call(layer)`."""
    for norm_first in (True, False):
        ours = s.owner()(config(norm_first, 0.5)).to(DTYPE).train()
        book = book_twin(ours)
        undropped = book_twin(ours)
        undropped.dropout = Dropout(0.0)  # no dropout on the sub-layers' outputs
        outputs = []
        for layer in (ours, book, undropped):
            torch.manual_seed(3)
            outputs.append(call(layer)[0])
        expect(outputs[0], outputs[1], f"the output in training ({style(norm_first)})",
               {NO_DROPOUT: outputs[2].detach()}, hint=DROPOUT_PLACE)


def encoder_dropout(s: Subject) -> None:
    """in training, dropout on each sub-layer's output, drawn as the book draws it"""
    x, keep = leaf(2, 5, D), keeping((5, 3), 5)
    with_dropout(s, lambda layer: returned(layer(x, AttentionScope(keep[:, None, None, :])), 2,
                                           "EncoderLayer in training"))


def decoder_inputs(T: int, S: int) -> tuple[Tensor, Tensor, AttentionScope, AttentionScope, Tensor]:
    x, memory, keep = leaf(2, T, D), leaf(2, S, D, seed=1), keeping((S, S - 2), S)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    return x, memory, AttentionScope(causal), AttentionScope(keep[:, None, None, :]), keep


def decoder_against_torch(s: Subject, norm_first: bool) -> None:
    ours, ref = paired_layer(s, norm_first)
    x, memory, self_scope, cross_scope, keep = decoder_inputs(5, 5)
    what = f"DecoderLayer ({style(norm_first)})"
    try:
        result = ours(x, memory, self_scope, cross_scope)  # cache=None, as in training
    except AttributeError as err:
        if "'NoneType'" not in str(err):
            raise
        raise Mismatch(f"{what} without a cache: AttributeError: {err}", NONE_CACHE) from err
    out, self_w, cross_w = returned(result, 3, what)
    expected = ref(x, memory, tgt_mask=~self_scope.mask, memory_key_padding_mask=~keep)
    expect(out, expected, f"the output ({style(norm_first)})",
           decoder_wrong(ours, x, memory, (self_scope, cross_scope)))
    _, book_self, book_cross = book_twin(ours)(x, memory, self_scope, cross_scope)
    swapped = {"the weights are swapped: return x, then self-attention's weights, then "
               "cross-attention's": book_cross.detach()}
    expect(self_w, book_self, "the self-attention weights (B, H, T, T)", swapped)
    expect(cross_w, book_cross, "the cross-attention weights (B, H, T, S)")


def decoder_pre_ln(s: Subject) -> None:
    """pre-LN (norm_first=True) with both masks, against nn.TransformerDecoderLayer"""
    decoder_against_torch(s, True)


def decoder_post_ln(s: Subject) -> None:
    """post-LN (norm_first=False) with both masks, against nn.TransformerDecoderLayer"""
    decoder_against_torch(s, False)


def decoder_gradients(s: Subject) -> None:
    """a source longer than the target; gradients of x, memory and the weights, against torch's"""
    for norm_first in (True, False):
        ours, ref = paired_layer(s, norm_first)
        x, memory, self_scope, cross_scope, keep = decoder_inputs(4, 6)
        out = returned(ours(x, memory, self_scope, cross_scope), 3, "DecoderLayer")[0]
        expected = ref(x, memory, tgt_mask=~self_scope.mask, memory_key_padding_mask=~keep)
        expect(out, expected, f"the output with T=4, S=6 ({style(norm_first)})")
        compare_gradients(out, expected, [x, memory, ours.cross_attn.out_proj.weight,
                                          ours.norm3.weight],
                          [x, memory, ref.multihead_attn.out_proj.weight, ref.norm3.weight],
                          ["x", "memory", "cross_attn.out_proj.weight", "norm3.weight"])


WHOLE_CACHE = ("pass the layer's two KVCaches, cache.self_attn and cache.cross_attn, not the "
               "DecoderLayerCache itself")
NO_CACHES = ("the caches are not passed to the sub-layers: cache.self_attn to self_attn, "
             "cache.cross_attn to cross_attn (None for both when cache is None)")
NO_SELF_CACHE = ("the self-attention cache is not passed to self_attn: without it, each step "
                 "sees only itself")
NO_CROSS_CACHE = ("the cross-attention cache is not passed to cross_attn: the memory's keys and "
                  "values are projected at the first step and kept there")
CACHES_SWAPPED = ("the caches are swapped: cache.self_attn goes to self_attn, cache.cross_attn "
                  "to cross_attn")


def cache_fault(cache: DecoderLayerCache, steps: int, S: int, err: Exception | None = None) -> str:
    """What the caches' contents after `steps` decoding steps say is wrong ("" if nothing)."""
    if err is not None and "DecoderLayerCache" in str(err):
        return WHOLE_CACHE
    n_self, n_cross = cache.self_attn.length, cache.cross_attn.length
    if (n_self, n_cross) == (0, 0):
        return NO_CACHES
    if n_self == S * steps and n_cross == 1:
        return CACHES_SWAPPED
    if n_self == 0:
        return NO_SELF_CACHE
    if n_cross == 0:
        return NO_CROSS_CACHE
    if (n_self, n_cross) != (steps, S):
        return (f"after {steps} steps the caches hold {n_self} and {n_cross} keys, expected "
                f"{steps} and {S}: call each sub-layer once per step, with its own cache")
    return ""


def decoder_with_a_cache(s: Subject) -> None:
    """decoding one token at a time with a DecoderLayerCache equals one causal pass"""
    ours, _ = paired_layer(s, True)
    x, memory, self_scope, cross_scope, _ = decoder_inputs(5, 6)
    full = returned(ours(x, memory, self_scope, cross_scope), 3, "DecoderLayer")[0]
    cache, steps = DecoderLayerCache(), []
    for t in range(5):  # a single new token needs no mask: the book's decode passes none
        try:
            result = ours(x[:, t:t + 1], memory, EVERY_KEY, cross_scope, cache)
        except NotImplementedError:
            raise
        except (RuntimeError, AttributeError) as err:
            hint = cache_fault(cache, t + 1, 6, err)
            if not hint:
                raise
            raise Mismatch(f"step {t + 1} with a cache: {type(err).__name__}: {err}",
                           hint) from err
        hint = cache_fault(cache, t + 1, 6)
        if hint:
            raise Mismatch(f"after step {t + 1}, the caches hold {cache.self_attn.length} and "
                           f"{cache.cross_attn.length} keys, expected {t + 1} and 6", hint)
        steps.append(returned(result, 3, "DecoderLayer with a cache")[0])
    expect(torch.cat(steps, dim=1), full, "the outputs decoded step by step with a cache",
           hint="each step must see the cached keys and values of the steps before it")


def decoder_dropout(s: Subject) -> None:
    """in training, dropout on each sub-layer's output, drawn as the book draws it"""
    x, memory, self_scope, cross_scope, _ = decoder_inputs(4, 6)
    with_dropout(s, lambda layer: returned(layer(x, memory, self_scope, cross_scope), 3,
                                           "DecoderLayer in training"))


CHECKS = {
    "subsequent_mask": (mask_values, mask_dtype_and_device),
    "EncoderLayer.forward": (encoder_pre_ln, encoder_post_ln, encoder_gradients, encoder_dropout),
    "DecoderLayer.forward": (decoder_pre_ln, decoder_post_ln, decoder_gradients,
                             decoder_with_a_cache, decoder_dropout),
    **decoding.CHECKS,  # greedy_decode
}
