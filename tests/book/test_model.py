"""Chapter 4, the model: layers against PyTorch's, masking, padding, attention maps, sizes and
greedy decoding with a KV cache."""

import importlib
import inspect
import pkgutil

import pytest
import torch
from torch import nn

import minitfm.book
from minitfm.book.attention import AttentionScope
from minitfm.book.model import (
    AttentionMaps,
    DecoderLayer,
    EncoderLayer,
    Seq2SeqTransformer,
    greedy_decode,
    subsequent_mask,
)
from minitfm.config import ModelConfig
from minitfm.tasks.base import SPECIAL_TOKENS, Vocab

PAD, BOS, EOS = 0, 1, 2
VOCAB = 11  # PAD, BOS, EOS and 8 data symbols (3..10)
TOKENS = Vocab((*SPECIAL_TOKENS, *map(str, range(3, VOCAB))))  # ids as above
DTYPE = torch.float64


def make_model(dtype=DTYPE, seed=0, **overrides) -> Seq2SeqTransformer:
    settings = dict(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32,
                    max_len=32) | overrides
    torch.manual_seed(seed)
    return Seq2SeqTransformer(ModelConfig(**settings), VOCAB, PAD).to(dtype).eval()


def symbols(*shape, seed=1):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def padded(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    width = width or max(map(len, rows))
    return torch.tensor([row + [PAD] * (width - len(row)) for row in rows])


def book_forwards():
    """Every `forward` defined by a class of a module in book/, by its qualified name."""
    for info in pkgutil.iter_modules(minitfm.book.__path__, "minitfm.book."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ \
                    and "forward" in vars(cls):
                yield f"{cls.__qualname__}.forward", vars(cls)["forward"]


def test_no_forward_in_the_book_takes_more_than_6_parameters():
    """What one call attends over travels as one AttentionScope, and instruments attach by
    hooks: a feature does not grow the book's signatures."""
    forwards = dict(book_forwards())
    assert {"MultiHeadAttention.forward", "EncoderLayer.forward", "DecoderLayer.forward",
            "Seq2SeqTransformer.forward"} <= forwards.keys()
    for name, forward in forwards.items():
        params = [p for p in inspect.signature(forward).parameters if p not in ("self", "ctx")]
        assert len(params) <= 6, f"{name} takes {len(params)} parameters: {params}"


def test_subsequent_mask():
    assert torch.equal(subsequent_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())


def load_from_reference(ours: nn.Module, ref: nn.Module) -> None:
    """Copy a randomised nn.TransformerEncoderLayer / DecoderLayer's weights into our layer."""
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
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


def layer_config(norm_first):
    return ModelConfig(d_model=8, n_heads=2, d_ff=16, norm_first=norm_first)


def assert_same_gradients(ours, ref, inputs, seed=0):
    g = torch.randn(ours.shape, dtype=DTYPE, generator=torch.Generator().manual_seed(seed))
    for a, b in zip(torch.autograd.grad(ours, inputs, g), torch.autograd.grad(ref, inputs, g),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_layer_matches_reference(norm_first):
    ours = EncoderLayer(layer_config(norm_first)).to(DTYPE)
    ref = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                     norm_first=norm_first).to(DTYPE)
    load_from_reference(ours, ref)
    x = torch.randn(2, 5, 8, dtype=DTYPE, requires_grad=True)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, S)
    out, _ = ours(x, AttentionScope(keep[:, None, None, :]))
    expected = ref(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(out[keep], expected[keep], rtol=0, atol=1e-12)
    assert_same_gradients(out[keep], expected[keep], [x])


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_layer_matches_reference(norm_first):
    ours = DecoderLayer(layer_config(norm_first)).to(DTYPE)
    ref = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                     norm_first=norm_first).to(DTYPE)
    load_from_reference(ours, ref)
    x = torch.randn(2, 4, 8, dtype=DTYPE, requires_grad=True)
    memory = torch.randn(2, 6, 8, dtype=DTYPE, requires_grad=True)
    keep = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])  # (B, S)
    out, _, _ = ours(x, memory, AttentionScope(subsequent_mask(4)),
                     AttentionScope(keep[:, None, None, :]))
    expected = ref(x, memory, tgt_mask=~subsequent_mask(4), memory_key_padding_mask=~keep)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert_same_gradients(out, expected, [x, memory])


@pytest.mark.parametrize("norm_first", [True, False])
def test_no_leakage_from_future_target_tokens(norm_first):
    model = make_model(norm_first=norm_first)
    src, tgt = symbols(2, 5), symbols(2, 6, seed=2)
    logits = model(src, tgt)
    for j in range(1, 6):
        changed = tgt.clone()
        changed[:, j:] = symbols(2, 6 - j, seed=10 + j)
        assert not torch.equal(changed, tgt)
        torch.testing.assert_close(model(src, changed)[:, :j], logits[:, :j], rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm_first", [True, False])
def test_source_padding_does_not_change_outputs(norm_first):
    model = make_model(norm_first=norm_first)
    src, tgt = symbols(2, 4), symbols(2, 5, seed=2)
    base = model(src, tgt)
    longer = torch.cat([src, torch.full((2, 3), PAD)], dim=1)
    torch.testing.assert_close(model(longer, tgt), base, rtol=0, atol=1e-12)


def test_padding_invariance_in_float32_and_across_a_batch():
    model = make_model(dtype=torch.float32)
    short, long = [3, 4, 5], [6, 7, 8, 9, 10, 3]
    tgt = symbols(1, 4, seed=2)
    alone = model(torch.tensor([short]), tgt)
    batched = model(padded([short, long]), tgt.expand(2, 4))
    torch.testing.assert_close(batched[:1], alone, rtol=0, atol=1e-5)


def test_logits_shape_and_attention_maps():
    model = make_model(n_encoder_layers=2, n_decoder_layers=3)
    src = padded([[3, 4, 5, 6, 7], [8, 9]])
    tgt = symbols(2, 4, seed=2)
    logits, maps = model(src, tgt, return_attention=True)
    assert logits.shape == (2, 4, VOCAB)
    assert isinstance(maps, AttentionMaps)
    assert [m.shape for m in maps.encoder] == [(2, 2, 5, 5)] * 2
    assert [m.shape for m in maps.decoder] == [(2, 2, 4, 4)] * 3
    assert [m.shape for m in maps.cross] == [(2, 2, 4, 5)] * 3
    for m in maps.encoder + maps.decoder + maps.cross:
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1], dtype=DTYPE))
    for m in maps.decoder:
        assert torch.all(m.triu(diagonal=1) == 0)  # nothing from the future
    for m in maps.encoder + maps.cross:
        assert torch.all(m[1, :, :, 2:] == 0)  # nothing from the second row's padding
    assert torch.equal(model(src, tgt), logits)


def expected_parameters(D, F, V, n_enc, n_dec, tied, norm_first=True, learned_len=0):
    """Count by hand: every Linear has a bias except the output projection."""
    attention = 4 * (D * D + D)  # q, k, v and output projections, D x D weights plus biases
    feed_forward = (D * F + F) + (F * D + D)
    layer_norm = 2 * D  # γ and δ
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm  # self- and cross-attention
    final_norms = 2 * layer_norm if norm_first else 0  # pre-LN only
    embedding = V * D  # shared by encoder and decoder
    output = 0 if tied else V * D
    return (embedding + learned_len * D + n_enc * encoder_layer + n_dec * decoder_layer
            + final_norms + output)


@pytest.mark.parametrize("tied, norm_first, positional, written_out", [
    (True, True, "sinusoidal", 8032),
    (False, True, "sinusoidal", 8208),
    (True, False, "learned", 8032 - 64 + 32 * 16),
])
def test_parameter_count(tied, norm_first, positional, written_out):
    model = make_model(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=1,
                       tie_embeddings=tied, norm_first=norm_first, positional=positional)
    learned_len = 32 if positional == "learned" else 0
    expected = expected_parameters(16, 32, VOCAB, 2, 1, tied, norm_first, learned_len)
    assert expected == written_out
    assert sum(p.numel() for p in model.parameters()) == expected
    assert (model.generator.weight is model.embedding.weight) == tied


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "none"])
def test_every_variant_trains_a_step(norm_first, positional):
    model = make_model(dtype=torch.float32, norm_first=norm_first, positional=positional,
                       dropout=0.1).train()
    src, tgt = symbols(3, 5), symbols(3, 6, seed=2)
    loss = torch.nn.functional.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_dropout_is_active_only_in_training():
    model = make_model(dtype=torch.float32, dropout=0.3)
    src, tgt = symbols(2, 5), symbols(2, 6, seed=2)
    assert torch.equal(model(src, tgt), model(src, tgt))
    model.train()
    assert not torch.equal(model(src, tgt), model(src, tgt))


def test_learned_positions_beyond_max_len_assert():
    """Eval, predict and training refuse such lengths first, in one line
    (catalog.position_shortfall); see test_evaluate's
    test_learned_positions_say_when_a_length_is_out_of_reach."""
    model = make_model(positional="learned", max_len=8)
    model(symbols(1, 8), symbols(1, 8))
    with pytest.raises(AssertionError, match=r"position 8 is past the 8 learned ones"):
        model(symbols(1, 9), symbols(1, 3))


def test_sinusoidal_positions_go_beyond_max_len():
    model = make_model(max_len=8)
    assert model(symbols(1, 12), symbols(1, 12)).shape == (1, 12, VOCAB)


def reference_decode(model, rows, max_len):
    """Greedy decoding one unpadded row at a time, re-running the whole model each step."""
    outputs = []
    for row in rows:
        src, tokens = torch.tensor([row]), [BOS]
        for _ in range(max_len):
            tokens.append(int(model(src, torch.tensor([tokens]))[0, -1].argmax()))
            if tokens[-1] == EOS:
                break
        outputs.append(tokens[1:])
    return padded(outputs)


def stop_early(model, src):
    """Swap EOS with a symbol the model first emits at different steps in different rows."""
    out = greedy_decode(model, src, TOKENS, max_len=10)
    firsts = {t: {(row == t).nonzero()[0, 0].item() for row in out if (row == t).any()}
              for t in range(3, VOCAB)}
    symbol = max(firsts, key=lambda t: len(firsts[t]))
    with torch.no_grad():
        weight = model.generator.weight
        weight[[EOS, symbol]] = weight[[symbol, EOS]]


@pytest.mark.parametrize("norm_first", [True, False])
def test_greedy_decode_matches_reference_with_and_without_cache(norm_first):
    model = make_model(seed=3, tie_embeddings=False, norm_first=norm_first)
    rows = [[3, 4, 5, 6, 7, 8], [9, 10], [5, 5, 5, 6], [7], [3, 10, 4]]
    src = padded(rows)
    stop_early(model, src)
    expected = reference_decode(model, rows, max_len=10)
    stops = [(row == EOS).nonzero()[0, 0].item() if (row == EOS).any() else None
             for row in expected]
    assert len({s for s in stops if s is not None}) >= 2, "rows should stop at different steps"
    cached = greedy_decode(model, src, TOKENS, max_len=10, use_cache=True)
    uncached = greedy_decode(model, src, TOKENS, max_len=10, use_cache=False)
    assert torch.equal(cached, expected)
    assert torch.equal(uncached, expected)


def test_greedy_decode_stops_when_every_row_has_ended_and_pads_after_eos():
    model = make_model(seed=3, tie_embeddings=False)
    rows = [[9, 10], [5, 5, 5, 6], [7]]
    src = padded(rows)
    stop_early(model, src)
    out = greedy_decode(model, src, TOKENS, max_len=10)
    expected = reference_decode(model, rows, max_len=10)  # the oracle: one row at a time
    assert out.dtype == torch.long
    assert out.shape == expected.shape and torch.equal(out, expected)
    assert out.size(1) < 10  # every row ended before max_len, and decoding stopped there
    assert (out == EOS).any(dim=1).all()
    ends = (out == EOS).int().argmax(dim=1)  # first EOS of each row
    assert ends.max() == out.size(1) - 1  # the last row to end sets the width
    assert len(set(ends.tolist())) == 3  # the rows end at different steps
    for row, end in zip(out, ends, strict=True):
        assert torch.all(row[end + 1:] == PAD) and not torch.any(row[:end] == PAD)
    assert not torch.any(out == BOS)


def test_greedy_decode_honours_max_len_and_restores_training_mode():
    model = make_model(dtype=torch.float32, tie_embeddings=False).train()
    with torch.no_grad():  # symbol 3 always wins, so no row ever stops
        model.decoder_norm.bias.zero_()
        model.decoder_norm.bias[0] = 100.0
        model.generator.weight.zero_()
        model.generator.weight[3, 0] = 1.0
    out = greedy_decode(model, symbols(3, 4), TOKENS, max_len=7)
    assert torch.equal(out, torch.full((3, 7), 3))
    assert model.training


def test_greedy_decode_with_learned_positions_caches_offsets():
    model = make_model(positional="learned", max_len=12, seed=4)
    src = padded([[3, 4, 5], [6, 7, 8, 9, 10]])
    cached = greedy_decode(model, src, TOKENS, max_len=11, use_cache=True)
    uncached = greedy_decode(model, src, TOKENS, max_len=11, use_cache=False)
    assert torch.equal(cached, uncached)
