"""Checks of chapter 3, positions: `sinusoids`, `Rotation.rotate`.

PyTorch has neither, so each is checked against the paper's formula (the book's function,
written out here in float64) and against the properties that make it work: a rotation keeps
lengths, and scores of rotated queries and keys depend only on relative position.

Shapes: B batch, H heads, T positions, D d_model, K d_head.
"""

from __future__ import annotations

import torch

from minitfm.book.positions import Rotation
from minitfm.learn.checks import (
    DTYPE,
    Mismatch,
    Subject,
    check_tensor,
    expect,
    gradients,
    leaf,
    same,
)

# --- the sinusoid table ---

SWAPPED = "sin and cos are swapped: column 2i gets the sin, column 2i + 1 the cos"
HALVES = ("sin and cos are interleaved: column 2i gets the sin and column 2i + 1 the cos, not "
          "all the sines then all the cosines")
EXPONENT_I = ("the exponent is 2i/D, not i/D: with i = 0, 1, ..., D/2 - 1 the pair's index, "
              "2i is its even column (torch.arange(0, D, 2) / D)")
EXPONENT_4I = ("the exponent counts the 2 twice: torch.arange(0, D, 2) already holds 2i, so "
               "divide it by D and no more")
PER_COLUMN = ("each pair shares one wavelength: column 2i + 1 is cos(pos / 10000^(2i/D)), with "
              "the same 2i as its sine, not 2i + 1")
INTEGER = ("every column has the same wavelength: the exponent 2i/D was computed in integers "
           "(// or an integer tensor); compute it in floats")
FROM_ONE = "positions start at 0: the first row is position 0 (sin 0 = 0, cos 0 = 1)"
ODD = ("with an odd D there is one more sine column than cosine ones: the sines take the "
       "ceil(D/2) angles, the cosines the first D // 2 of them (angles[:, : D // 2])")
DEFAULT_DTYPE = ("make the table in torch's default dtype, as torch.zeros(length, d_model) "
                 "does: the model adds it to float32 embeddings")


def table(length: int, d_model: int, power=None, start: int = 0, swap: bool = False):
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...), in float64, or a wrong
    form of it: another exponent (`power` of each column), positions from `start`, sin and cos
    swapped."""
    position = torch.arange(start, start + length, dtype=DTYPE)[:, None]  # (length, 1)
    column = torch.arange(d_model, dtype=DTYPE)  # (D,)
    power = 2 * (column // 2) / d_model if power is None else power(column)
    angles = position / 10000.0 ** power  # (length, D): a pair's two columns share an angle
    even = (torch.arange(d_model) % 2 == 0) != swap
    return torch.where(even, angles.sin(), angles.cos())  # (length, D)


def halves(length: int, d_model: int):
    """The sines of every pair's angle, then the cosines (tensor2tensor's layout)."""
    position = torch.arange(length, dtype=DTYPE)[:, None]  # (length, 1)
    power = torch.arange(0, d_model, 2, dtype=DTYPE) / d_model  # (ceil(D/2),)
    angles = position / 10000.0 ** power  # (length, ceil(D/2))
    return torch.cat([angles.sin(), angles.cos()[:, : d_model // 2]], dim=-1)  # (length, D)


def table_wrong_outputs(length: int, d_model: int) -> dict[str, torch.Tensor]:
    """The tables of the usual mistakes, each named by its hint."""
    return {SWAPPED: table(length, d_model, swap=True), HALVES: halves(length, d_model),
            EXPONENT_I: table(length, d_model, lambda c: (c // 2) / d_model),
            EXPONENT_4I: table(length, d_model, lambda c: 4 * (c // 2) / d_model),
            PER_COLUMN: table(length, d_model, lambda c: c / d_model),
            INTEGER: table(length, d_model, lambda c: 0 * c),
            FROM_ONE: table(length, d_model, start=1)}


def expect_table(actual, length: int, d_model: int) -> None:
    """The learner's table equals the paper's, in torch's default dtype (its values to float32
    precision); else the hint of the mistake it matches, or of the property it breaks."""
    expected, dtype = table(length, d_model), torch.get_default_dtype()
    if isinstance(actual, torch.Tensor) and actual.dtype != dtype:
        raise Mismatch(f"the table is {actual.dtype}, not {dtype}", DEFAULT_DTYPE)
    check_tensor(actual, expected.to(dtype), f"sinusoids({length}, {d_model})",
                 "the table is (length, d_model): a row per position")
    hint = next((h for h, wrong in table_wrong_outputs(length, d_model).items()
                 if same(actual, wrong, atol=1e-5)), "")
    if not hint and not same(actual[0], expected[0], atol=1e-5):
        hint = "row 0 is position 0: sin 0 = 0 in the even columns, cos 0 = 1 in the odd ones"
    elif not hint and not same(actual[:, 0], expected[:, 0], atol=1e-5):
        hint = "column 0 is sin(pos): its wavelength is 2π (10000^0 = 1)"
    expect(actual, expected.to(actual.dtype), f"sinusoids({length}, {d_model})",
           hint=hint or "the wavelengths: column 2i and 2i + 1 use pos / 10000^(2i/D)",
           atol=1e-5)


def sinusoids_match_the_paper(s: Subject) -> None:
    """sinusoids(9, 8): sin(pos / 10000^(2i/D)) in column 2i, its cos in column 2i + 1"""
    expect_table(s(9, 8), 9, 8)


def sinusoids_odd_sizes(s: Subject) -> None:
    """an odd d_model (7: four sine columns, three cosine ones), one position, 40 positions"""
    for length, d_model in ((5, 7), (1, 4), (40, 6)):
        try:
            got = s(length, d_model)
        except RuntimeError as err:
            if d_model % 2:
                raise Mismatch(f"sinusoids({length}, {d_model}) raised RuntimeError: {err}",
                               ODD) from err
            raise
        if d_model % 2 and isinstance(got, torch.Tensor) and got.shape != (length, d_model):
            raise Mismatch(f"sinusoids({length}, {d_model}) has shape {tuple(got.shape)}", ODD)
        expect_table(got, length, d_model)


# --- RoPE's rotation ---

NORMS = ("a rotation keeps each pair's length: (a cos - b sin)² + (a sin + b cos)² = a² + b²; "
         "check the signs, and that a and b are one pair turned by one angle")
IN_PLACE = ("rotate changed x in place: return a new tensor (torch.stack of the turned pairs), "
            "the caller still uses x")
RELATIVE = ("q·k must depend only on i - j: turn every pair (a, b) by the rotation's angle of "
            "its position, the same for queries and keys: (a cos - b sin, a sin + b cos)")
ROPE_HALVES = ("pairs are adjacent features, (x_2i, x_2i+1) = x[..., 0::2], x[..., 1::2], not the "
               "two halves of x (GPT-NeoX's layout)")
NOT_INTERLEAVED = ("put each turned pair back in its place: torch.stack((first, second), "
                   "dim=-1).flatten(-2) interleaves them; torch.cat puts all the firsts first")
BACKWARDS = "turned the wrong way: (a cos - b sin, a sin + b cos) turns (a, b) by +angle"
FIRST_T = ("x holds the last T of the rotation's positions: take cos[..., -T:, :] (with a KV "
           "cache the rotation holds every key position, x only this step's keys)")
PER_ROW = ("the rotation may hold a row's own positions, (B, 1, T, K/2): slice the positions "
           "dim, the second last, cos[..., -T:, :], which suits (T, K/2) too")


def rotation(positions, d_head: int = 6, rows: bool = False) -> tuple[torch.Tensor, ...]:
    """cos and sin of RoPE's angles p θ_i, θ_i = 10000^(-2i/K), in float64: (T, K/2), or
    (B, 1, T, K/2) for positions (B, T) when `rows`."""
    theta = 10000.0 ** (-torch.arange(0, d_head, 2, dtype=DTYPE) / d_head)  # (K/2,)
    angles = positions[..., None].to(DTYPE) * theta  # (T, K/2) or (B, T, K/2)
    if rows:
        angles = angles.unsqueeze(1)  # (B, 1, T, K/2)
    return angles.cos(), angles.sin()


def turn(x, cos, sin, split: str = "adjacent", join: str = "adjacent", sign: float = 1.0):
    """x (..., T, K) turned pair by pair by (cos, sin) of shape (..., T, K/2), or a wrong form:
    pairs taken as the two `halves`, turned pairs put back as halves, turned by -angle."""
    half = x.size(-1) // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if split == "adjacent" else (x[..., :half], x[..., half:])
    turned = (a * cos - b * sign * sin, a * sign * sin + b * cos)  # (..., T, K/2) each
    if join == "adjacent":
        return torch.stack(turned, dim=-1).flatten(-2)  # (..., T, K)
    return torch.cat(turned, dim=-1)  # (..., T, K)


def rope_wrong_outputs(x, cos, sin) -> dict[str, torch.Tensor]:
    """The outputs of the usual RoPE mistakes, each named by its hint."""
    with torch.no_grad():
        T = x.size(-2)
        return {ROPE_HALVES: turn(x, cos[..., -T:, :], sin[..., -T:, :], "halves", "halves"),
                NOT_INTERLEAVED: turn(x, cos[..., -T:, :], sin[..., -T:, :], join="halves"),
                BACKWARDS: turn(x, cos[..., -T:, :], sin[..., -T:, :], sign=-1.0),
                FIRST_T: turn(x, cos[..., :T, :], sin[..., :T, :])}


def rotate(s: Subject, x, cos, sin, hint: str = ""):
    """The learner's rotation by (cos, sin) of x; a shape error there means `hint` when given."""
    try:
        return s.owner()(cos, sin).rotate(x)
    except RuntimeError as err:
        if hint and "size" in str(err):
            raise Mismatch(f"RuntimeError: {err}", hint) from err
        raise


def rotate_keeps_norms(s: Subject) -> None:
    """each vector keeps its length (a rotation turns each pair, keeping its length)"""
    x = leaf(2, 3, 5, 6) * 1.0  # (B, H, T, K); not a leaf, so that writing into it is allowed
    before = x.detach().clone()
    out = rotate(s, x, *rotation(torch.arange(10, 15)))
    check_tensor(out, x, "rotate(x)", "rotate returns x's shape, (B, H, T, K)")
    if not torch.equal(x.detach(), before):
        raise Mismatch("x was changed by rotate", IN_PLACE)
    expect(out.norm(dim=-1), x.norm(dim=-1), "the length of each turned vector", hint=NORMS)


def rotate_relative_positions(s: Subject) -> None:
    """q at i and k at j score as q at i + c and k at j + c: scores see only i - j"""
    q, k = leaf(6, seed=1).detach(), leaf(6, seed=2).detach()
    cos, sin = rotation(torch.arange(8))  # (T, K/2), T = 8
    turned_q = rotate(s, q.repeat(1, 1, 8, 1), cos, sin)  # (1, 1, T, K): q at 0, 1, ..., 7
    turned_k = rotate(s, k.repeat(1, 1, 8, 1), cos, sin)  # (1, 1, T, K)
    scores = (turned_q @ turned_k.transpose(-2, -1))[0, 0]  # (T, T): score of q at i, k at j
    if not same(scores[1:, 1:], scores[:-1, :-1]):
        gap = (scores[1:, 1:] - scores[:-1, :-1]).abs().max().item()
        raise Mismatch(f"the score of q at i + 1 and k at j + 1 differs from that of q at i and k "
                       f"at j by up to {gap:.3g}", RELATIVE)


def rotate_matches_the_book(s: Subject) -> None:
    """x (B, H, T, K) turned pair by pair (adjacent features), against the book"""
    x = leaf(2, 3, 5, 6)  # (B, H, T, K)
    cos, sin = rotation(torch.arange(10, 15))  # (T, K/2)
    expect(rotate(s, x, cos, sin), Rotation(cos, sin).rotate(x), "rotate(x)",
           rope_wrong_outputs(x, cos, sin), hint=RELATIVE)


def rotate_uses_the_last_positions(s: Subject) -> None:
    """with a KV cache: x (B, H, 3, K) holds the last 3 of the rotation's 10 positions"""
    x = leaf(2, 3, 3, 6, seed=3)  # (B, H, T, K): this step's keys
    cos, sin = rotation(torch.arange(10))  # (10, K/2): every key position, cached ones first
    expect(rotate(s, x, cos, sin, FIRST_T), Rotation(cos, sin).rotate(x),
           "rotate(x) of the last 3 positions", rope_wrong_outputs(x, cos, sin), hint=FIRST_T)


def rotate_per_row_positions(s: Subject) -> None:
    """a rotation of each row's own positions (B, 1, T, K/2), as in training with random ones"""
    x = leaf(3, 2, 2, 6, seed=4)  # (B, H, T, K)
    positions = torch.tensor([[0, 3, 4, 9], [1, 2, 5, 6], [7, 8, 12, 13]])  # (B, 4)
    cos, sin = rotation(positions, rows=True)  # (B, 1, 4, K/2)
    expect(rotate(s, x, cos, sin, PER_ROW), Rotation(cos, sin).rotate(x),
           "rotate(x) by each row's positions", rope_wrong_outputs(x, cos, sin), hint=PER_ROW)


def rotate_gradients(s: Subject) -> None:
    """the gradient of x, against the book's rotation"""
    x = leaf(2, 3, 5, 6, seed=5)
    cos, sin = rotation(torch.arange(3, 8))
    got = gradients(rotate(s, x, cos, sin), [x])[0]
    if got is None:
        raise Mismatch("no gradient reaches x", "compute with tensor operations only (no "
                       ".detach(), .item() or .data on the way)")
    expect(got, gradients(Rotation(cos, sin).rotate(x), [x])[0], "the gradient of x")


CHECKS = {
    "sinusoids": (sinusoids_match_the_paper, sinusoids_odd_sizes),
    "Rotation.rotate": (rotate_keeps_norms, rotate_relative_positions, rotate_matches_the_book,
                        rotate_uses_the_last_positions, rotate_per_row_positions,
                        rotate_gradients),
}
