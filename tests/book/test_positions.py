"""Chapter 3, positions: sinusoids as the paper writes them, learned positions, the schemes."""

import math

import pytest
import torch

from minitfm.book.positions import (
    ALiBiPositions,
    LearnedPositions,
    NoPositions,
    RotaryPositions,
    SinusoidalPositions,
    make_positional,
)


def test_sinusoids_follow_the_paper():
    D = 8
    pe = SinusoidalPositions(16, D)(torch.zeros(1, 16, D))[0]  # (T, D)
    for pos in (0, 1, 7, 15):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoids_with_offset_and_beyond_the_cached_length():
    positions = SinusoidalPositions(4, 6)
    whole = positions(torch.zeros(1, 10, 6))  # longer than the cached 4
    tail = positions(torch.zeros(1, 3, 6), offset=7)
    torch.testing.assert_close(tail, whole[:, 7:10])
    assert "table" not in positions.state_dict()  # a cache, not saved in checkpoints


def test_learned_positions_beyond_max_len_assert():
    """Run-time lengths are checked before the model runs (catalog.position_shortfall)."""
    positions = LearnedPositions(8, 4)
    assert positions(torch.zeros(2, 8, 4)).shape == (2, 8, 4)
    with pytest.raises(AssertionError, match=r"position 8 is past the 8 learned ones"):
        positions(torch.zeros(2, 1, 4), offset=8)


def test_make_positional_kinds():
    assert isinstance(make_positional("sinusoidal", 8, 4), SinusoidalPositions)
    assert isinstance(make_positional("learned", 8, 4), LearnedPositions)
    rope = make_positional("rope", 8, 8, n_heads=2)
    assert isinstance(rope, RotaryPositions) and rope.inv_freq.shape == (2,)  # K/2 for K = 4
    alibi = make_positional("alibi", 8, 8, n_heads=2)
    assert isinstance(alibi, ALiBiPositions) and alibi.slopes.shape == (2,)
    x = torch.randn(1, 3, 4)
    for kind in ("none", "rope", "alibi"):  # nothing added to the embeddings
        assert torch.equal(make_positional(kind, 8, 4)(x, offset=2), x)
    assert isinstance(make_positional("none", 8, 4), NoPositions)
    with pytest.raises(AssertionError, match="'rotary' is not one of"):
        make_positional("rotary", 8, 4)


def test_positions_given_explicitly_index_the_table():
    """Randomized positions hand (B, T) indices instead of an offset."""
    for scheme in (SinusoidalPositions(16, 4), LearnedPositions(16, 4)):
        x = torch.randn(2, 3, 4)
        positions = torch.tensor([[0, 5, 9], [2, 3, 15]])
        out = scheme(x, positions=positions)
        table = scheme(torch.zeros(1, 16, 4))[0]  # (16, D): each position's vector
        torch.testing.assert_close(out, x + table[positions])
