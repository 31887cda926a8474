"""Chapter 3's checks fail realistic wrong versions, each with the hint naming its mistake."""

import math

import pytest
import torch

import minitfm.book.positions as book
from minitfm.learn.checks import positions as hints
from minitfm.learn.grading import check_function


def failed_with(name, function, hint):
    grade = check_function(name, function)
    assert grade.status == "failed" and hint in grade.hint, (grade.check, grade.message, grade.hint)


# --- the sinusoid table ---

def table_variant(swap=False, step=2, start=0, layout="interleaved", power=None):
    """The book's sinusoids, written out, with one thing done wrong: `step` is the exponent's
    2 in 2i/D (1: i/D), `power` the exponent of each column given outright."""
    def sinusoids(length, d_model):
        position = torch.arange(start, start + length, dtype=torch.float32).unsqueeze(1)
        i = torch.arange((d_model + 1) // 2)
        angles = position / 10000 ** (step * i / d_model)  # (length, ceil(D/2))
        first, second = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
        if layout == "halves":
            return torch.cat([first(angles), second(angles[:, : d_model // 2])], dim=-1)
        table = torch.zeros(length, d_model)
        if power is not None:
            angles = position / 10000 ** power(torch.arange(d_model), d_model)
            table[:, 0::2], table[:, 1::2] = first(angles[:, 0::2]), second(angles[:, 1::2])
            return table
        table[:, 0::2] = first(angles)
        table[:, 1::2] = second(angles[:, : d_model // 2])
        return table
    return sinusoids


def even_only(length, d_model):
    """Written for an even d_model: D/2 angles for both the sines and the cosines."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    angles = position / 10000 ** (torch.arange(0, d_model, 2) / d_model)  # (length, ceil(D/2))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


def in_float64(length, d_model):
    return book.sinusoids(length, d_model).double()


@pytest.mark.parametrize("variant, hint", [
    (table_variant(swap=True), "sin and cos are swapped"),
    (table_variant(step=1), "not i/D"),
    (table_variant(step=4), "counts the 2 twice"),
    (table_variant(power=lambda column, D: column / D), "each pair shares one wavelength"),
    (table_variant(power=lambda column, D: column // 2 * 2 // D), "in integers"),
    (table_variant(layout="halves"), "not all the sines then all the cosines"),
    (table_variant(start=1), "positions start at 0"),
    (even_only, "one more sine column"),
    (in_float64, "torch's default dtype"),
], ids=["swapped", "i/D", "4i/D", "per column", "integer", "halves", "from 1", "odd D",
        "float64"])
def test_wrong_sinusoids_fail_with_their_hint(variant, hint):
    failed_with("sinusoids", variant, hint)


def test_sinusoids_in_float64_then_float32_pass():
    def sinusoids(length, d_model):
        position = torch.arange(length, dtype=torch.float64)[:, None]
        column = torch.arange(d_model, dtype=torch.float64)
        angles = position * torch.exp(-(column // 2) * 2 * math.log(10000.0) / d_model)
        even = torch.arange(d_model) % 2 == 0
        return torch.where(even, angles.sin(), angles.cos()).float()

    assert check_function("sinusoids", sinusoids).status == "passed"


# --- RoPE's rotation ---

def rotate_variant(halves=False, cat=False, sign=1.0, first=False, norm_sign=1.0, sin_abs=False):
    """The book's Rotation.rotate with one thing done wrong."""
    def rotate(self, x):
        T = x.size(-2)
        part = slice(None, T) if first else slice(-T, None)
        cos, sin = self.cos[..., part, :], self.sin[..., part, :]  # (..., T, K/2)
        sin = sin.abs() if sin_abs else sign * sin
        half = x.size(-1) // 2
        a, b = (x[..., :half], x[..., half:]) if halves else (x[..., 0::2], x[..., 1::2])
        turned = (a * cos - b * sin, norm_sign * a * sin + b * cos)
        if halves or cat:
            return torch.cat(turned, dim=-1)
        return torch.stack(turned, dim=-1).flatten(-2)
    return rotate


def llama_mixup(self, x):
    """Interleaved angles with the two-halves rotate_half: a pairing mixed from two layouts."""
    T = x.size(-2)
    cos = self.cos[..., -T:, :].repeat_interleave(2, dim=-1)  # (..., T, K)
    sin = self.sin[..., -T:, :].repeat_interleave(2, dim=-1)
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


def in_place(self, x):
    T = x.size(-2)
    cos, sin = self.cos[..., -T:, :], self.sin[..., -T:, :]
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = even * cos - odd * sin
    x[..., 1::2] = even * sin + odd * cos
    return x


def float32_buffer(self, x):
    T = x.size(-2)
    cos, sin = self.cos[..., -T:, :], self.sin[..., -T:, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.zeros(x.shape)  # torch's default dtype, not x's
    out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
    return out


def batch_slice(self, x):
    T = x.size(-2)
    cos, sin = self.cos[-T:], self.sin[-T:]  # the first dim: positions only when (T, K/2)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


@pytest.mark.parametrize("variant, hint", [
    (rotate_variant(norm_sign=-1.0), "keeps each pair's length"),
    (llama_mixup, "keeps each pair's length"),
    (rotate_variant(halves=True), "not the two halves"),
    (rotate_variant(cat=True), "put each turned pair back in its place"),
    (rotate_variant(sign=-1.0), "turned the wrong way"),
    (rotate_variant(first=True), "the last T of the rotation's positions"),
    (rotate_variant(sin_abs=True), "depend only on i - j"),
    (in_place, "in place"),
    (batch_slice, "the second last"),
    (float32_buffer, "the input's dtype"),
], ids=["sign typo", "mixed layouts", "halves", "cat", "backwards", "first T", "not relative",
        "in place", "batch slice", "float32"])
def test_wrong_rotations_fail_with_their_hint(variant, hint):
    failed_with("Rotation.rotate", variant, hint)


def test_a_complex_rotation_passes():
    def rotate(self, x):
        T = x.size(-2)
        turn = torch.complex(self.cos[..., -T:, :], self.sin[..., -T:, :])  # e^(i angle)
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())  # (..., T, K/2)
        return torch.view_as_real(pairs * turn).flatten(-2)

    assert check_function("Rotation.rotate", rotate).status == "passed"


def test_a_rotation_that_takes_every_angle_is_told_to_take_the_last():
    def rotate(self, x):  # right when x holds every position, as without a cache
        even, odd = x[..., 0::2], x[..., 1::2]
        turned = (even * self.cos - odd * self.sin, even * self.sin + odd * self.cos)
        return torch.stack(turned, dim=-1).flatten(-2)

    failed_with("Rotation.rotate", rotate, hints.FIRST_T)
