"""Chapter 4's checks fail realistic wrong versions, each with the hint naming its mistake.

Each wrong version is the book's code written out with one mistake (`variant(**mistake)`); the
same code with no mistake passes, so it is the mistake that each failure comes from.
"""

import pytest
import torch

import minitfm.book.model as book
from minitfm.book.attention import EVERY_KEY
from minitfm.learn.checks import decoding
from minitfm.learn.checks import model as hints
from minitfm.learn.grading import check_function


def failed_with(name, function, hint):
    grade = check_function(name, function)
    assert grade.status == "failed" and hint in grade.hint, (grade.check, grade.message, grade.hint)


# --- the causal mask ---

@pytest.mark.parametrize("mask, hint", [
    (lambda size, device=None: torch.ones(size, size, dtype=torch.bool, device=device).tril(1),
     "the diagonal is off by one"),
    (lambda size, device=None: torch.ones(size, size, dtype=torch.bool, device=device).triu(),
     "torch.tril, not torch.triu"),
    (lambda size, device=None: torch.ones(size, size, dtype=torch.bool, device=device).triu(1),
     "nn.Transformer's convention"),
    (lambda size, device=None: torch.ones(size, size, dtype=torch.bool, device=device).tril(-1),
     "does not see itself"),
    (lambda size, device=None: torch.ones(size, size, device=device).tril(), "dtype=torch.bool"),
    (lambda size, device=None: torch.ones(size, size, dtype=torch.long, device=device).tril(),
     "dtype=torch.bool"),
    (lambda size, device=None: torch.ones(size, size, dtype=torch.bool).tril(),
     "make it on `device`"),
    (lambda size, device=None: torch.full((size, size), float("-inf"), device=device).triu(1),
     "added to the scores"),
], ids=["leaks the future", "triu", "inverted", "no diagonal", "float", "long", "device",
        "additive"])
def test_a_wrong_causal_mask_fails_with_its_hint(mask, hint):
    failed_with("subsequent_mask", mask, hint)


# --- the layers ---

def identity(t):
    return t


def encoder_variant(**mistake):
    """The book's EncoderLayer.forward written out, with the mistakes named."""
    def forward(self, x, scope):
        pre = mistake.get("norm_first", self.norm_first)
        n1, n2 = (getattr(self, n) for n in mistake.get("norms", ("norm1", "norm2")))
        scope = EVERY_KEY if mistake.get("no_mask") else scope
        drop = identity if mistake.get("no_dropout") else self.dropout
        if pre:
            h = n1(x)
            attn, weights = self.self_attn(h, h, h, scope)
            x = (h if mistake.get("normed") else 0 if mistake.get("no_residual") else x) \
                + drop(attn)
            h = n2(x)
            x = (h if mistake.get("normed") else x) + drop(self.feed_forward(h))
        elif mistake.get("post_ln") == "inside":  # the sub-layer's output normalised, not the sum
            attn, weights = self.self_attn(x, x, x, scope)
            x = x + n1(drop(attn))
            x = x + n2(drop(self.feed_forward(x)))
        elif mistake.get("post_ln") == "before":  # the input normalised, the sum left as it is
            h = n1(x)
            attn, weights = self.self_attn(h, h, h, scope)
            x = h + drop(attn)
            h = n2(x)
            x = h + drop(self.feed_forward(h))
        else:
            attn, weights = self.self_attn(x, x, x, scope)
            x = n1((0 if mistake.get("no_residual") else x) + drop(attn))
            x = n2(x + drop(self.feed_forward(x)))
        return x, weights
    return forward


@pytest.mark.parametrize("mistake, hint", [
    ({"norm_first": True}, "norm_first is not followed"),
    ({"norm_first": False}, "norm_first is not followed"),
    ({"no_residual": True}, "the self-attention sub-layer has no residual"),
    ({"norms": ("norm2", "norm1")}, "the norms are mixed up (norm2, norm1"),
    ({"norms": ("norm1", "norm1")}, "the norms are mixed up (norm1, norm1"),
    ({"normed": True}, "the residual adds norm(x)"),
    ({"no_mask": True}, "the padding mask is not applied"),
    ({"no_dropout": True}, "dropout on each sub-layer's output is missing"),
    ({"post_ln": "inside"}, "post-LN normalises the residual sum, not the sub-layer's output"),
    ({"post_ln": "before"}, "post-LN normalises after the residual sum, not before"),
], ids=["always pre-LN", "always post-LN", "no residual", "norms swapped", "one norm",
        "normed residual", "no mask", "no dropout", "post-LN norm inside",
        "post-LN norm before"])
def test_a_wrong_encoder_layer_fails_with_its_hint(mistake, hint):
    failed_with("EncoderLayer.forward", encoder_variant(**mistake), hint)


def sublayer_caches(cache, mistake):
    """The caches the self- and cross-attention get, right or with the mistake named."""
    how = mistake.get("caches")
    if how == "unchecked":  # no test for None
        return cache.self_attn, cache.cross_attn
    if cache is None or how == "none":
        return None, None
    return {"whole": (cache, cache), "swapped": (cache.cross_attn, cache.self_attn),
            "no cross": (cache.self_attn, None)}.get(how, (cache.self_attn, cache.cross_attn))


def decoder_variant(**mistake):
    """The book's DecoderLayer.forward written out, with the mistakes named."""
    def forward(self, x, memory, self_scope, cross_scope, cache=None):
        pre = mistake.get("norm_first", self.norm_first)
        norms = [getattr(self, n) for n in mistake.get("norms", ("norm1", "norm2", "norm3"))]
        if mistake.get("swap_scopes"):
            self_scope, cross_scope = cross_scope, self_scope
        self_cache, cross_cache = sublayer_caches(cache, mistake)
        drop = identity if mistake.get("no_dropout") else self.dropout
        weights = []

        def self_attend(h):
            attn, w = self.self_attn(h, h, h, self_scope, self_cache)
            weights.append(w)
            return attn

        def cross_attend(h):
            source = h if mistake.get("cross_from_x") else memory
            attn, w = self.cross_attn(h, source, source, cross_scope, cross_cache)
            weights.append(w)
            return attn

        for i, sublayer in enumerate((self_attend, cross_attend, self.feed_forward)):
            keep = 0 if mistake.get("no_residual") == i else 1
            if pre:
                x = keep * x + drop(sublayer(norms[i](x)))
            elif mistake.get("post_ln") == "inside":
                x = x + norms[i](drop(sublayer(x)))
            else:
                x = norms[i](keep * x + drop(sublayer(x)))
        return x, weights[0], weights[1]
    return forward


@pytest.mark.parametrize("mistake, hint", [
    ({"norm_first": True}, "norm_first is not followed"),
    ({"norm_first": False}, "norm_first is not followed"),
    ({"no_residual": 1}, "the cross-attention sub-layer has no residual"),
    ({"no_residual": 2}, "the feed-forward sub-layer has no residual"),
    ({"norms": ("norm1", "norm3", "norm2")}, "the norms are mixed up (norm1, norm3, norm2"),
    ({"cross_from_x": True}, "cross-attention reads x instead of memory"),
    ({"swap_scopes": True}, "the scopes are swapped"),
    ({"caches": "none"}, "the caches are not passed to the sub-layers"),
    ({"caches": "no cross"}, "the cross-attention cache is not passed"),
    ({"caches": "swapped"}, "the caches are swapped"),
    ({"caches": "whole"}, "not the DecoderLayerCache itself"),
    ({"caches": "unchecked"}, "cache may be None"),
    ({"no_dropout": True}, "dropout on each sub-layer's output is missing"),
    ({"post_ln": "inside"}, "post-LN normalises the residual sum, not the sub-layer's output"),
], ids=["always pre-LN", "always post-LN", "no cross residual", "no ff residual",
        "norms swapped", "cross reads x", "scopes swapped", "no caches", "no cross cache",
        "caches swapped", "whole cache", "cache None", "no dropout", "post-LN norm inside"])
def test_a_wrong_decoder_layer_fails_with_its_hint(mistake, hint):
    failed_with("DecoderLayer.forward", decoder_variant(**mistake), hint)


def test_the_layer_variants_without_a_mistake_pass():
    assert check_function("EncoderLayer.forward", encoder_variant()).status == "passed"
    assert check_function("DecoderLayer.forward", decoder_variant()).status == "passed"


# --- greedy decoding ---

def greedy_variant(**mistake):
    """The book's greedy_decode written out, with the mistakes named."""
    def greedy_decode(model, src, vocab, max_len, use_cache=True, encoded=None):
        was_training, given = model.training, encoded
        if not mistake.get("dropout_on"):
            model.eval()
        if encoded is None or mistake.get("ignore_encoded"):
            encoded = model.encode(src)[:2]
        memory, src_mask = encoded
        use_cache = use_cache and not mistake.get("never_cache")
        tokens = torch.full((src.size(0), 1), vocab.bos_id)
        done = torch.zeros(src.size(0), dtype=torch.bool)
        cache = model.new_cache() if use_cache else None
        for _ in range(max_len + mistake.get("extra_steps", 0)):
            newest = use_cache != mistake.get("feed_wrong", False)
            step = tokens[:, -1:] if newest else tokens
            if mistake.get("reencode") and given is None:  # slower, but right
                memory, src_mask = model.encode(src)[:2]
            token = model.decode(step, memory, src_mask, cache)[0][:, -1].argmax(-1)
            if mistake.get("done_first"):
                done |= token == vocab.eos_id
            if not mistake.get("no_pad"):
                token = token.masked_fill(done, model.pad_id)
            tokens = torch.cat([tokens, token[:, None]], dim=1)
            done |= token == vocab.eos_id
            if (done.any() if mistake.get("first_stop") else done.all()) \
                    and not mistake.get("no_stop"):
                break
        if mistake.get("restore", True):
            model.train(True if mistake.get("train_after") else was_training)
        return tokens if mistake.get("keep_bos") else tokens[:, 1:]

    return greedy_decode if mistake.get("grad") else torch.no_grad()(greedy_decode)


@pytest.mark.parametrize("mistake, hint", [
    ({"no_stop": True}, "decoding goes on after every row has ended"),
    ({"first_stop": True}, "decoding stops when the first row ends"),
    ({"no_pad": True}, "tokens after EOS"),
    ({"done_first": True}, "EOS is missing"),
    ({"keep_bos": True}, "the output starts with BOS"),
    ({"feed_wrong": True}, "with the cache, feed only the newest token"),
    ({"never_cache": True}, "use_cache is ignored"),
    ({"extra_steps": -1}, "max_len - 1 tokens"),
    ({"extra_steps": 1}, "more than max_len tokens"),
    ({"dropout_on": True}, "dropout is on while decoding"),
    ({"restore": False}, "put the model back in the mode it was in"),
    ({"train_after": True}, "put the model back in the mode it was in"),
    ({"ignore_encoded": True}, "`encoded` is ignored"),
    ({"grad": True}, "torch.no_grad"),
], ids=["no stop", "first stop", "no pad", "EOS dropped", "BOS kept", "cache fed all",
        "cache ignored", "max_len - 1", "max_len + 1", "dropout on", "eval left", "train after",
        "encoded ignored", "gradients"])
def test_a_wrong_greedy_decode_fails_with_its_hint(mistake, hint):
    failed_with("greedy_decode", greedy_variant(**mistake), hint)


def test_feeding_only_the_newest_token_without_a_cache_is_named():
    def greedy_decode(model, src, vocab, max_len, use_cache=True, encoded=None):
        if use_cache:
            return book.greedy_decode(model, src, vocab, max_len, True, encoded)
        return greedy_variant(feed_wrong=True)(model, src, vocab, max_len, False, encoded)

    failed_with("greedy_decode", greedy_decode, "without the cache (use_cache=False), feed all")


def test_the_greedy_variants_without_a_mistake_pass_and_re_encoding_is_allowed():
    assert check_function("greedy_decode", greedy_variant()).status == "passed"
    assert check_function("greedy_decode", greedy_variant(reencode=True)).status == "passed"


def test_the_decoding_model_ends_its_rows_at_different_steps():
    """What the greedy checks rely on: every row ends before max_len, at different steps."""
    for norm_first in (True, False):
        model = decoding.decoding_model(norm_first)
        out = book.greedy_decode(model, decoding.sources(), decoding.VOCAB, decoding.STEPS)
        assert (out == decoding.EOS).any(dim=1).all()
        ends = (out == decoding.EOS).int().argmax(dim=1)
        assert len(set(ends.tolist())) >= 3 and out.size(1) < decoding.STEPS


def test_every_hint_of_chapter_4_is_told_apart():
    names = [v for k, v in vars(hints).items() if k.isupper() and isinstance(v, str)]
    names += [v for k, v in vars(decoding).items() if k.isupper() and isinstance(v, str)]
    assert len(names) == len(set(names))
