"""Checks of chapter 4's greedy decoding, `greedy_decode` (the layers' are in `model.py`).

PyTorch has no greedy decoding: the learner's is compared with the book's on a tiny model whose
rows end at different steps, and with properties: the same tokens with and without the KV
cache, max_len honoured, dropout off while decoding and the model's mode given back, `encoded`
used when given. Known wrong versions are run on the same model to name the likely mistake.

Shapes: B batch, S source len, T decoded tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitfm.book.model import Seq2SeqTransformer
from minitfm.book.model import greedy_decode as book_decode
from minitfm.config import ModelConfig
from minitfm.learn.checks import DTYPE, Mismatch, Subject, diagnose
from minitfm.tasks.base import SPECIAL_TOKENS, Vocab

VOCAB = Vocab((*SPECIAL_TOKENS, *map(str, range(8))))  # PAD 0, BOS 1, EOS 2, symbols 3..10
PAD, BOS, EOS = VOCAB.pad_id, VOCAB.bos_id, VOCAB.eos_id
ROWS = ((3, 4, 5, 6, 7, 8), (9, 10), (5, 5, 5, 6), (7,), (3, 10, 4))
STEPS = 10  # max_len in the checks: every row of the decoding model ends before

NO_PAD = ("tokens after EOS: a row that has ended gets PAD at every later step "
          "(next_token.masked_fill(done, model.pad_id))")
NO_STOP = ("decoding goes on after every row has ended: stop as soon as each row has written "
           "EOS (done.all())")
FIRST_STOP = "decoding stops when the first row ends: go on until every row has written EOS"
BOS_KEPT = "the output starts with BOS: return the decoded tokens only (tokens[:, 1:])"
EOS_DROPPED = ("EOS is missing: write the EOS a row decodes, and PAD only at the steps after "
               "it (mark the row done after writing its token)")
ALL_CACHED = ("with the cache, feed only the newest token (tokens[:, -1:]): the cache holds the "
              "others")
NEWEST_UNCACHED = ("without the cache (use_cache=False), feed all the tokens so far: nothing "
                   "else remembers them")
ENCODED_IGNORED = ("`encoded` is ignored: when it is given, decode from its memory and source "
                   "mask instead of encoding src")
RESTORE = ("put the model back in the mode it was in: the book's `with eval_mode(model):` does, "
           "or model.train(was_training) at the end")
DROPOUT_ON = ("dropout is on while decoding: decode in eval mode (the book's "
              "`with eval_mode(model):`), so that decoding is deterministic")
LOOP = ("follow the book's loop: encode once, start from BOS, each step the argmax of the last "
        "position's logits, PAD for rows already done")


def sources() -> Tensor:
    """ROWS, padded: (5, 6)."""
    return torch.tensor([row + (PAD,) * (6 - len(row)) for row in ROWS])


def decoding_model(norm_first: bool = True, dropout: float = 0.0) -> Seq2SeqTransformer:
    """A tiny model (in eval mode) whose rows end at different steps: seed 153 writes symbol 6
    in every row, first at steps 1 to 5, and EOS's output row is swapped with symbol 6's."""
    cfg = ModelConfig(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32,
                      max_len=64, norm_first=norm_first, dropout=dropout, tie_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(153)
        model = Seq2SeqTransformer(cfg, len(VOCAB), PAD).to(DTYPE).eval()
    with torch.no_grad():
        weight = model.generator.weight
        weight[[EOS, 6]] = weight[[6, EOS]]
    return model


@torch.no_grad()
def decoded(model: Seq2SeqTransformer, src: Tensor, max_len: int, how: str = "") -> Tensor:
    """Greedy decoding as the book does it, or with the mistake `how`."""
    memory, src_mask, _ = model.encode(src)
    tokens = torch.full((src.size(0), 1), BOS)  # (B, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool)  # (B,)
    cache = None if how == "newest, no cache" else model.new_cache()
    for _ in range(max_len):
        step = tokens if how == "all, cached" else tokens[:, -1:]  # (B, t) or (B, 1)
        token = model.decode(step, memory, src_mask, cache)[0][:, -1].argmax(-1)  # (B,)
        if how != "no pad":
            token = token.masked_fill(done, PAD)
        tokens = torch.cat([tokens, token[:, None]], dim=1)  # (B, t + 1)
        done |= token == EOS
        if (bool(done.all()) and how != "no stop") or (bool(done.any()) and how == "first stop"):
            break
    return tokens[:, 1:]


def decoding_wrong(model: Seq2SeqTransformer, src: Tensor, expected: Tensor) -> dict:
    """The tokens of the usual mistakes in greedy decoding, each named by its hint."""
    wrong = {hint: decoded(model, src, STEPS, how) for hint, how in (
        (NO_PAD, "no pad"), (NO_STOP, "no stop"), (FIRST_STOP, "first stop"),
        (ALL_CACHED, "all, cached"), (NEWEST_UNCACHED, "newest, no cache"))}
    wrong[BOS_KEPT] = torch.cat([torch.full((src.size(0), 1), BOS), expected], dim=1)
    wrong[EOS_DROPPED] = expected.masked_fill(expected == EOS, PAD)
    return wrong


def where_differs(actual: Tensor, expected: Tensor) -> str:
    if actual.dim() == 2:
        for i, (got, want) in enumerate(zip(actual.tolist(), expected.tolist(), strict=False)):
            if got != want:
                return f"row {i} is {got}, the book decodes {want}"
    return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"


def expect_tokens(actual, expected: Tensor, what: str, wrong: dict | None = None,
                  hint: str = LOOP) -> None:
    """`actual` holds the `expected` token ids, else a Mismatch naming the known mistake it
    matches (`wrong`: hint -> that mistake's tokens), or where it first differs."""
    if not isinstance(actual, Tensor):
        raise Mismatch(f"{what} are a {type(actual).__name__}, not a tensor",
                       "return the tokens as one (B, T) tensor of ids")
    if actual.dtype == expected.dtype and actual.shape == expected.shape \
            and torch.equal(actual, expected):
        return
    found = diagnose(actual, wrong or {})
    if not found and actual.dtype != expected.dtype:
        raise Mismatch(f"{what} are {actual.dtype}, not {expected.dtype}",
                       "token ids are integers: torch.long, as argmax returns them")
    raise Mismatch(f"{what}: {where_differs(actual, expected)}", found or hint)


def decode_matches_the_book(s: Subject) -> None:
    """rows that end at different steps, with the KV cache, against the book's greedy decoding"""
    for norm_first in (True, False):
        model, src = decoding_model(norm_first), sources()
        expected = book_decode(model, src, VOCAB, STEPS)
        wrong = decoding_wrong(model, src, expected)
        got = s(model, src, VOCAB, STEPS, use_cache=True)
        style = "pre-LN" if norm_first else "post-LN"
        expect_tokens(got, expected, f"the decoded tokens ({style})", wrong)


def decode_without_the_cache(s: Subject) -> None:
    """use_cache=False decodes the same tokens as the book (and as with the cache)"""
    model, src = decoding_model(), sources()
    expected = book_decode(model, src, VOCAB, STEPS)
    wrong = decoding_wrong(model, src, expected)
    got = s(model, src, VOCAB, STEPS, use_cache=False)
    expect_tokens(got, expected, "the tokens decoded with use_cache=False", wrong)


def decode_feeds_one_token(s: Subject) -> None:
    """with use_cache, each step feeds the decoder only the newest token"""
    model, src = decoding_model(), sources()
    widths = []
    model.decoder_layers[0].register_forward_pre_hook(
        lambda module, args: widths.append(args[0].size(1)))
    s(model, src, VOCAB, STEPS, use_cache=True)
    if any(width != 1 for width in widths):
        raise Mismatch(f"with use_cache=True, the decoder's steps got {widths} tokens",
                       "use_cache is ignored: with it, make model.new_cache(), pass it to "
                       "model.decode at every step, and feed only the newest token")


def never_ending_model() -> Seq2SeqTransformer:
    """The decoding model made to write symbol 3 at every step, never EOS."""
    model = decoding_model()
    with torch.no_grad():
        model.decoder_norm.bias.zero_()
        model.decoder_norm.bias[0] = 100.0
        model.generator.weight.zero_()
        model.generator.weight[3, 0] = 1.0
    return model


def decode_honours_max_len(s: Subject) -> None:
    """a model that never writes EOS: max_len tokens per row, with and without the cache"""
    model, src = never_ending_model(), sources()
    wrong = {"max_len - 1 tokens: max_len counts the decoded tokens, BOS not included":
             torch.full((5, 6), 3),
             "more than max_len tokens: decode max_len steps at most": torch.full((5, 8), 3)}
    for use_cache in (True, False):
        got = s(model, src, VOCAB, 7, use_cache=use_cache)
        expect_tokens(got, torch.full((5, 7), 3), f"the tokens with max_len=7 and use_cache="
                      f"{use_cache}", wrong)


def decode_in_training_mode(s: Subject) -> None:
    """a model in training mode: decoded with dropout off, and left in training mode"""
    model, src = decoding_model(dropout=0.3), sources()
    expected = book_decode(model, src, VOCAB, STEPS)
    model.train()
    got = s(model, src, VOCAB, STEPS)
    expect_tokens(got, expected, "the tokens decoded from a model in training mode (dropout "
                  "0.3)", hint=DROPOUT_ON)
    if not all(m.training for m in model.modules()):
        raise Mismatch("the model was in training mode and is in eval mode after decoding",
                       RESTORE)
    model.eval()
    s(model, src, VOCAB, STEPS)
    if any(m.training for m in model.modules()):
        raise Mismatch("the model was in eval mode and is in training mode after decoding",
                       RESTORE)


def decode_with_encoded(s: Subject) -> None:
    """`encoded`, when given, is the memory decoded from"""
    model, src = decoding_model(), sources()
    with torch.no_grad():
        memory, src_mask, _ = model.encode(src.flip(0))  # each row another row's source
    expected = book_decode(model, src, VOCAB, STEPS, encoded=(memory, src_mask))
    ignored = book_decode(model, src, VOCAB, STEPS)
    got = s(model, src, VOCAB, STEPS, encoded=(memory, src_mask))
    expect_tokens(got, expected, "the tokens decoded from `encoded`", {ENCODED_IGNORED: ignored})


def decode_without_gradients(s: Subject) -> None:
    """no gradients are recorded while decoding (torch.no_grad, as the book decorates it)"""
    model, src = decoding_model(), sources()
    recorded = []
    model.generator.register_forward_hook(
        lambda module, args, out: recorded.append(out.requires_grad))
    s(model, src, VOCAB, STEPS)
    if any(recorded):
        raise Mismatch("the logits record gradients while decoding",
                       "decode under torch.no_grad(): put @torch.no_grad() above the function, "
                       "as the book does; decoding needs no gradients, and their graph costs "
                       "memory")


CHECKS = {
    "greedy_decode": (decode_matches_the_book, decode_without_the_cache, decode_feeds_one_token,
                      decode_honours_max_len, decode_in_training_mode, decode_with_encoded,
                      decode_without_gradients),
}
