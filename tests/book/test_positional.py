"""Positional schemes (sinusoidal, learned, RoPE, ALiBi, none) and randomized positions in the
whole model (their settings in configs and runs: tests/run/test_positional.py)."""

import math

import pytest
import torch

from minitfm.book.attention import AttentionScope, KVCache, MultiHeadAttention
from minitfm.book.model import Seq2SeqTransformer, greedy_decode
from minitfm.book.positions import (
    ALiBiPositions,
    RotaryPositions,
    alibi_slopes,
    make_positional,
    sample_positions,
)
from minitfm.catalog import POSITIONALS
from minitfm.config import ModelConfig
from tests.book.test_model import BOS, EOS, PAD, TOKENS, VOCAB, padded, reference_decode, symbols

DTYPE = torch.float64

# Every scheme, and randomized positions on top of each scheme that has positions.
SETTINGS = [(kind, None) for kind in POSITIONALS] + [
    (kind, 40) for kind in POSITIONALS if kind != "none"]
IDS = [f"{kind}{'+random' if limit else ''}" for kind, limit in SETTINGS]


def make_model(positional, random_positions=None, seed=0, **overrides):
    settings = dict(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32,
                    max_len=40, positional=positional, random_positions=random_positions)
    torch.manual_seed(seed)
    cfg = ModelConfig(**(settings | overrides))
    return Seq2SeqTransformer(cfg, VOCAB, PAD).to(DTYPE).eval()


# Every scheme in the whole model


@pytest.mark.parametrize("positional, limit", SETTINGS, ids=IDS)
def test_shapes_and_attention_rows(positional, limit):
    model = make_model(positional, limit)
    src, tgt = padded([[3, 4, 5, 6, 7], [8, 9]]), symbols(2, 4, seed=2)
    for mode in (model.eval, model.train):  # training mode draws random positions
        mode()
        logits, maps = model(src, tgt, return_attention=True)
        assert logits.shape == (2, 4, VOCAB)
        assert [m.shape for m in maps.encoder] == [(2, 2, 5, 5)] * 2
        assert [m.shape for m in maps.decoder] == [(2, 2, 4, 4)] * 2
        assert [m.shape for m in maps.cross] == [(2, 2, 4, 5)] * 2
        for m in maps.encoder + maps.decoder + maps.cross:
            torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1], dtype=DTYPE))
        for m in maps.decoder:
            assert torch.all(m.triu(diagonal=1) == 0)
        for m in maps.encoder + maps.cross:
            assert torch.all(m[1, :, :, 2:] == 0)  # the second row's padding


@pytest.mark.parametrize("positional, limit", SETTINGS, ids=IDS)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_no_leakage_from_future_target_tokens(positional, limit, training):
    model = make_model(positional, limit).train(training)
    src, tgt = symbols(2, 5), symbols(2, 6, seed=2)
    torch.manual_seed(7)  # the same random positions for every call below
    logits = model(src, tgt)
    for j in range(1, 6):
        changed = tgt.clone()
        changed[:, j:] = symbols(2, 6 - j, seed=10 + j)
        torch.manual_seed(7)
        torch.testing.assert_close(model(src, changed)[:, :j], logits[:, :j], rtol=0, atol=1e-12)


@pytest.mark.parametrize("positional, limit", SETTINGS, ids=IDS)
def test_source_padding_does_not_change_outputs(positional, limit):
    model = make_model(positional, limit)
    short, long = [3, 4, 5], [6, 7, 8, 9, 10, 3]
    tgt = symbols(1, 4, seed=2)
    alone = model(torch.tensor([short]), tgt)
    batched = model(padded([short, long]), tgt.expand(2, 4))
    wider = model(padded([short, long], width=9), tgt.expand(2, 4))
    torch.testing.assert_close(batched[:1], alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(wider, batched, rtol=0, atol=1e-12)


@pytest.mark.parametrize("positional, limit", SETTINGS, ids=IDS)
def test_greedy_decode_is_the_same_with_and_without_the_cache(positional, limit):
    model = make_model(positional, limit, seed=3, tie_embeddings=False)
    with torch.no_grad():  # EOS is likely but not certain, so rows stop at different steps
        model.generator.weight[EOS] += 0.5
    rows = [[3, 4, 5, 6, 7, 8], [9, 10], [5, 5, 5, 6], [7], [3, 10, 4]]
    expected = reference_decode(model, rows, max_len=12)
    cached = greedy_decode(model, padded(rows), TOKENS, max_len=12, use_cache=True)
    uncached = greedy_decode(model, padded(rows), TOKENS, max_len=12, use_cache=False)
    assert torch.equal(cached, expected)
    assert torch.equal(uncached, expected)


@pytest.mark.parametrize("positional", POSITIONALS)
def test_every_scheme_trains_a_step_with_dropout(positional):
    model = make_model(positional, 40 if positional != "none" else None, dropout=0.1).train()
    src, tgt = symbols(3, 5), symbols(3, 6, seed=2)
    loss = torch.nn.functional.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("positional", ["rope", "alibi", "none"])
def test_schemes_inside_attention_add_no_parameters(positional):
    count = sum(p.numel() for p in make_model(positional).parameters())
    assert count == sum(p.numel() for p in make_model("sinusoidal").parameters())
    assert make_model(positional).state_dict().keys() == make_model("none").state_dict().keys()


def test_sinusoidal_and_learned_do_nothing_inside_attention():
    positions = torch.arange(4)
    for kind in ("sinusoidal", "learned", "none"):
        scheme = make_positional(kind, 8, 4, 2)
        assert not scheme.in_attention and scheme.attention(positions, positions) is None


# RoPE


def test_rope_matches_complex_multiplication():
    """Su et al. 2021, §3.2.1: pair (x_2i, x_2i+1) as x_2i + i x_2i+1, times e^(i p θ_i)."""
    K, positions = 8, torch.tensor([0, 1, 5, 11])
    x = torch.randn(2, 3, 4, K, dtype=DTYPE)  # (B, H, T, K)
    rotated = RotaryPositions(K).to(DTYPE).rotation(positions).rotate(x)
    theta = 10000.0 ** (-torch.arange(0, K, 2, dtype=DTYPE) / K)  # (K/2,)
    turn = torch.polar(torch.ones(4, K // 2, dtype=DTYPE), positions[:, None] * theta)  # (T, K/2)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(2, 3, 4, K // 2, 2)) * turn)
    # θ is stored in float32 (a buffer, like the sinusoid table), hence not 1e-12.
    torch.testing.assert_close(rotated, expected.flatten(-2), rtol=0, atol=1e-6)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))  # a rotation
    torch.testing.assert_close(rotated[:, :, 0], x[:, :, 0])  # position 0: unchanged


def test_rope_scores_depend_only_on_position_differences():
    rope = RotaryPositions(8).to(DTYPE)
    q, k = torch.randn(1, 2, 5, 8, dtype=DTYPE), torch.randn(1, 2, 7, 8, dtype=DTYPE)
    q_pos, k_pos = torch.tensor([0, 2, 3, 9, 10]), torch.arange(7)

    def scores(shift):
        return rope.rotation(q_pos + shift).rotate(q) @ rope.rotation(k_pos + shift).rotate(
            k).transpose(-2, -1)  # (1, 2, 5, 7)

    for shift in (1, 17, 250):
        torch.testing.assert_close(scores(shift), scores(0), rtol=0, atol=1e-10)
    assert not torch.allclose(scores(0), q @ k.transpose(-2, -1))  # positions do matter


def test_rope_self_attention_cache_matches_the_full_pass():
    attn, rope = MultiHeadAttention(8, 2).to(DTYPE), RotaryPositions(4).to(DTYPE)
    x = torch.randn(2, 6, 8, dtype=DTYPE)
    everything = rope.attention(torch.arange(6), torch.arange(6))
    full, _ = attn(x, x, x, AttentionScope(torch.ones(6, 6, dtype=torch.bool).tril(), everything))
    cache, steps = KVCache(grow=True), []
    for t in range(6):  # queries at their absolute position, keys rotated once and cached
        step = rope.attention(torch.tensor([t]), torch.arange(t + 1))
        out, _ = attn(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], AttentionScope(positions=step),
                      cache=cache)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)
    k = attn.split_heads(attn.k_proj(x))  # (B, H, T, K)
    torch.testing.assert_close(cache.k, everything.keys.rotate(k), rtol=0, atol=1e-12)


def test_rope_cross_attention_turns_keys_by_source_position():
    rope = RotaryPositions(4).to(DTYPE)
    tgt, src = torch.arange(3), torch.arange(5)
    cross = rope.attention(tgt, src, cross=True)
    assert cross.queries.cos.shape == (3, 2) and cross.keys.cos.shape == (5, 2)
    assert cross.bias is None
    # One query vector at every target position, one key vector at every source position:
    # the scores then differ by position alone, and RoPE makes them depend on j - i only.
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 2, 1, 4, dtype=DTYPE, generator=generator).expand(2, 1, 2, 9, 4)
    # source positions as their own tensor, so that the keys get their own rotation
    at = rope.attention(torch.arange(9), torch.arange(9).clone(), cross=True)
    scores = at.queries.rotate(q) @ at.keys.rotate(k).transpose(-2, -1)  # (B, H, T, S)
    for shift in (1, 3):
        torch.testing.assert_close(scores[..., shift:, shift:], scores[..., :-shift, :-shift],
                                   rtol=0, atol=1e-12)  # (i, j) scores as (i+k, j+k)
    assert not torch.allclose(scores[..., 0, 0], scores[..., 0, 1])  # the keys did turn
    assert not torch.allclose(scores[..., 0, 1], scores[..., 1, 0])  # j - i, not |j - i|


# ALiBi


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(4).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256]  # 2^(-8h/4)
    assert alibi_slopes(8).tolist() == [2.0 ** -h for h in range(1, 9)]
    # 6 heads: the 4-head slopes, then the 1st and 3rd of the 8-head ones.
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]


def test_alibi_bias_by_hand():
    alibi = ALiBiPositions(2).to(DTYPE)  # slopes 1/16 and 1/256
    bias = alibi.bias(torch.arange(4), torch.arange(4))
    distance = torch.tensor([[0, 1, 2, 3],
                             [1, 0, 1, 2],
                             [2, 1, 0, 1],
                             [3, 2, 1, 0]], dtype=DTYPE)
    expected = torch.stack([-distance / 16, -distance / 256])  # (H, T, T)
    assert bias.shape == (2, 4, 4)
    torch.testing.assert_close(bias, expected, rtol=0, atol=0)
    # Decoding step 3 with a cache: query position 3 against keys 0..3 is the last row.
    step = alibi.bias(torch.tensor([3]), torch.arange(4))
    torch.testing.assert_close(step, torch.tensor([[[-3 / 16, -2 / 16, -1 / 16, 0]],
                                                   [[-3 / 256, -2 / 256, -1 / 256, 0]]],
                                                  dtype=DTYPE))
    # Per-row positions (randomized training): distances between the drawn positions.
    rows = alibi.bias(torch.tensor([[0, 4], [2, 3]]), torch.tensor([[0, 4], [2, 3]]))
    assert rows.shape == (2, 2, 2, 2)
    assert rows[0, 0, 0, 1] == -4 / 16 and rows[1, 1, 1, 0] == -1 / 256


def test_alibi_decoder_weights_are_the_papers_causal_bias():
    """Decoder self-attention: softmax(q·k/sqrt(K) - m (i - j)) over j <= i."""
    attn, alibi = MultiHeadAttention(8, 2).to(DTYPE), ALiBiPositions(2).to(DTYPE)
    x = torch.randn(1, 4, 8, dtype=DTYPE)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    scope = AttentionScope(mask, alibi.attention(torch.arange(4), torch.arange(4)))
    _, weights = attn(x, x, x, scope)
    q, k = attn.split_heads(attn.q_proj(x)), attn.split_heads(attn.k_proj(x))  # (1, H, T, K)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    scores = q @ k.transpose(-2, -1) / 2 - alibi.slopes[:, None, None] * (i - j)  # (1, H, T, T)
    expected = scores.masked_fill(~mask, -math.inf).softmax(-1)
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-12)


def test_alibi_cross_attention_measures_target_to_source_distance():
    cross = ALiBiPositions(2).attention(torch.arange(2), torch.arange(3), cross=True)
    expected = -torch.tensor([[0, 1, 2], [1, 0, 1]]) * alibi_slopes(2)[:, None, None]  # (H, T, S)
    torch.testing.assert_close(cross.bias, expected, rtol=0, atol=0)


def test_without_positions_the_source_is_a_multiset():
    """NoPE: the encoder is permutation-equivariant and cross-attention ignores key order."""
    model = make_model("none")
    src, tgt = symbols(2, 6), symbols(2, 4, seed=2)
    shuffled = src[:, torch.randperm(6, generator=torch.Generator().manual_seed(0))]
    torch.testing.assert_close(model(shuffled, tgt), model(src, tgt), rtol=0, atol=1e-12)


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_a_reversed_source_gives_other_outputs(positional):
    """ALiBi's symmetric encoder bias alone would be blind to reading the source backwards."""
    model = make_model(positional)
    src, tgt = symbols(2, 6), symbols(2, 4, seed=2)
    assert not torch.allclose(model(src, tgt), model(src.flip(1), tgt))


# Randomized positions (Ruoss et al. 2023)


def test_sampled_positions_are_sorted_distinct_and_in_range():
    torch.manual_seed(0)
    lengths = torch.tensor([1, 4, 6, 6, 3])
    positions = sample_positions(lengths, width=6, limit=10)
    assert positions.shape == (5, 6) and positions.dtype == torch.long
    assert positions.min() >= 0 and positions.max() <= 9
    for row, n in zip(positions, lengths.tolist()):
        real = row[:n]
        assert torch.all(real[1:] > real[:-1])  # sorted and distinct
        assert torch.all(row[n:] == 9)  # padding: the last position, never attended to


def test_sampled_positions_span_from_0_to_n_up_to_the_whole_range():
    """Each row draws from [0, span), span uniform in [n, limit]: 0..n-1 itself now and then."""
    torch.manual_seed(0)
    short = sample_positions(torch.tensor([3] * 31000), width=3, limit=64)  # 62 spans: 3..64
    exactly_0_to_n = (short == torch.arange(3)).all(dim=1).double().mean().item()
    # Span s (1 in 62) draws 0, 1, 2 with chance 1 / C(s, 3): certainly for s = 3.
    expected = sum(1 / math.comb(span, 3) for span in range(3, 65)) / 62
    assert abs(exactly_0_to_n - expected) < 0.004
    assert short.max() == 63 and short.min() == 0
    # A row of length 1 is at a uniform position of [0, span): mean (E[span] - 1) / 2 = 15.75.
    single = sample_positions(torch.ones(20000, dtype=torch.long), width=1, limit=64)
    assert abs(single.double().mean().item() - 15.75) < 0.5
    # Padding does not matter: a length-1 row padded to 16 draws like one of width 1.
    padded_rows = sample_positions(torch.ones(20000, dtype=torch.long), width=16, limit=64)
    assert abs(padded_rows[:, 0].double().mean().item() - 15.75) < 0.5


def test_sampled_positions_use_the_global_rng():
    lengths = torch.tensor([3, 5])
    torch.manual_seed(4)
    a = sample_positions(lengths, 5, 32)
    torch.manual_seed(4)
    assert torch.equal(sample_positions(lengths, 5, 32), a)
    assert not torch.equal(sample_positions(lengths, 5, 32), a)


def test_sampling_more_positions_than_the_range_asserts():
    """Training refuses such lengths first (test_train_refuses_a_range_shorter_than_...)."""
    with pytest.raises(AssertionError, match=r"9 distinct positions cannot be drawn from \[0, 8\)"):
        sample_positions(torch.tensor([9]), width=9, limit=8)


def test_model_draws_one_subset_for_source_and_target_in_training_only():
    model = make_model("rope", 40).train()
    src, tgt = padded([[3, 4, 5], [6, 7, 8, 9, 10]]), padded([[BOS, 3, 4, 5], [BOS, 6, 7]])
    src_pos, tgt_pos = model.draw_positions(src, tgt)
    assert src_pos.shape == (2, 5) and tgt_pos.shape == (2, 4)
    assert torch.equal(src_pos[:, :4], tgt_pos)  # source token i and target input i agree
    assert torch.all(src_pos[0, 1:4] > src_pos[0, :3])  # row 0: 4 real tokens (BOS + 3)
    assert torch.all(src_pos[1, 1:] > src_pos[1, :-1])  # row 1: 5 real source tokens
    # Evaluation uses 0..n-1: the same logits as a model that never randomizes.
    plain = make_model("rope", None)
    plain.load_state_dict(model.state_dict())
    model.eval()
    torch.testing.assert_close(model(src, tgt), plain(src, tgt), rtol=0, atol=0)
    model.train()
    assert not torch.allclose(model(src, tgt), plain(src, tgt))  # training: other positions


def test_sinusoidal_table_covers_the_random_range():
    model = make_model("sinusoidal", 300, max_len=40)
    assert model.positional.table.size(0) == 300
    model.train()(symbols(2, 5), symbols(2, 6, seed=2))  # positions up to 299 index the table
