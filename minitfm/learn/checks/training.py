"""Checks of the training chapters: `AdamW.step` (optim), `lr_factor` (loop), `LengthStats.add`
(metrics).

AdamW takes five steps on a small model whose gradients are set by hand, the same at every try,
so that the parameters of each known wrong version can be worked out beside torch.optim.AdamW's.
The schedule and the metrics have no PyTorch twin: they are compared with the book's, value by
value, so that a failure names the first step or the first pair that differs.

Shapes: N the number of parameter values (all parameters as one flat vector), S the steps taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitfm.book.loop import lr_factor
from minitfm.book.metrics import LengthStats
from minitfm.config import TrainConfig
from minitfm.learn.checks import DTYPE, Mismatch, Subject, same

# --- AdamW ---

BETAS, EPS, WEIGHT_DECAY, MAX_NORM = (0.9, 0.98), 1e-8, 0.3, 1.0
LRS = (0.02, 0.1, 0.07, 0.04, 0.01)  # a changing lr, as the schedule sets it before each step
NORMS = (3.0, 0.4, 1.5, 0.6, 2.0)  # each step's gradient norm: some above MAX_NORM, some below

NO_CORRECTION = ("the moments are not bias-corrected: use m / (1 - β1^t) and v / (1 - β2^t), "
                 "with t the step count from 1")
COUPLED = ("weight decay is added to the gradient (L2, as Adam does): AdamW decays the weights "
           "apart from it, θ ← θ − lr λ θ, and the moments see g alone")
EVERY = ("weight decay reaches every parameter: decay the matrices only, by self.decay (λ for a "
         "matrix, 0 for biases and the norms' γ and δ)")
AFTER = ("weight decay is applied after the update: decay θ as it was before this step, "
         "θ ← θ − lr λ θ first, then the Adam update")
NO_LR = "weight decay is not scaled by the learning rate: θ ← θ − lr λ θ (lr times λ)"
NO_DECAY = "weight decay is missing: θ ← θ − lr λ θ, with λ from self.decay"
EPS_INSIDE = "ε is inside the square root: add it after, sqrt(v̂) + ε"
EPS_EARLY = ("ε is added before the bias correction: divide v by 1 - β2^t first (or sqrt(v) by "
             "its root), then add ε")
FRESH = ("the moments start from zero at every step: keep them in self.exp_avg and "
         "self.exp_avg_sq, updated in place, from one step to the next")
SWAPPED = ("the running means are weighted the wrong way round: m ← β1 m + (1 − β1) g, "
           "v ← β2 v + (1 − β2) g² (lerp_(g, 1 - β1))")
NOT_CLIPPED = ("the update uses the gradient as it was before clipping: scale g by "
               "min(1, max_norm / ‖g‖) before the moments use it")
ALWAYS = ("every gradient is scaled to max_norm, small ones too: clip only a larger one, "
          "g · min(1, max_norm / ‖g‖)")
EACH = ("each parameter's gradient is clipped on its own: clip by the norm of all the gradients "
        "together, one global norm, as clip_grad_norm_")
NOT_IN_PLACE = ("the parameters did not change: they are views of self.flat, so update self.flat "
                "in place (mul_, addcdiv_, -=), not by making a new tensor")
NO_GRAD = "an in-place update of a parameter that records gradients: keep @torch.no_grad()"
NOT_FINITE = ("t counts from 1: increment self.t before the bias corrections (at t = 0, "
              "1 - β^t is 0, and dividing by it gives inf, NaN or ZeroDivisionError)")
NORM_AFTER = ("the norm returned is the one after clipping: return ‖g‖ measured before it, as "
              "clip_grad_norm_ does (the run logs it)")
SQUARED = "the norm returned is squared: return its square root, ‖g‖ = sqrt(Σ g²)"
NO_NORM = "return the gradient norm before clipping (a 0-dim tensor), as the docstring says"
STATE = ("keep m, v and the step count in self.exp_avg, self.exp_avg_sq and self.t: "
         "state_dict saves them, and a resumed run goes on from them")


@dataclass(frozen=True)
class Flaw:
    """A way of writing AdamW wrong (the defaults: none), to work out what it would give."""

    corrected: bool = True  # bias correction
    decay: str = "before"  # or "every", "after", "no lr", "none", "coupled" (L2)
    eps: str = "outside"  # or "inside" (sqrt(v̂ + ε)), "early" ((sqrt(v) + ε) / sqrt(1 - β2^t))
    clip: str = "global"  # or "none", "always" (scaled to max_norm), "each" (per parameter)
    fresh: bool = False  # moments from zero at every step
    swapped: bool = False  # β and 1 - β swapped in the running means


FLAWS = {NO_CORRECTION: Flaw(corrected=False), COUPLED: Flaw(decay="coupled"),
         EVERY: Flaw(decay="every"), AFTER: Flaw(decay="after"), NO_LR: Flaw(decay="no lr"),
         NO_DECAY: Flaw(decay="none"), EPS_INSIDE: Flaw(eps="inside"), EPS_EARLY: Flaw(eps="early"),
         NOT_CLIPPED: Flaw(clip="none"), ALWAYS: Flaw(clip="always"), EACH: Flaw(clip="each"),
         FRESH: Flaw(fresh=True), SWAPPED: Flaw(swapped=True)}


@dataclass(frozen=True)
class Course:
    """The steps to take: the start θ (N,), each step's gradient (S, N) and lr, and clipping."""

    theta: Tensor
    grads: Tensor
    max_norm: float | None
    matrices: Tensor  # 1.0 where a value belongs to a matrix (decayed), else 0.0: (N,)
    sizes: tuple[int, ...]  # each parameter's number of values, in order


def small_model() -> nn.Module:
    """Matrices (decayed), biases and a norm's γ and δ (not decayed), float64."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)).to(DTYPE)


def flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # (N,)


def course(max_norm: float | None) -> Course:
    """Gradients whose values span six orders of magnitude (so ε matters), at norms NORMS."""
    model = small_model()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    generator = torch.Generator().manual_seed(7)
    scales = 10.0 ** torch.linspace(-6, 0, n, dtype=DTYPE)[torch.randperm(n, generator=generator)]
    grads = torch.randn(len(NORMS), n, dtype=DTYPE, generator=generator) * scales  # (S, N)
    grads = grads / grads.norm(dim=1, keepdim=True) * torch.tensor(NORMS, dtype=DTYPE)[:, None]
    matrices = torch.cat([torch.full((p.numel(),), float(p.dim() >= 2), dtype=DTYPE)
                          for p in params])
    return Course(flat(model), grads, max_norm, matrices, tuple(p.numel() for p in params))


def set_gradients(model: nn.Module, g: Tensor) -> None:
    for p, piece in zip(model.parameters(), g.split([p.numel() for p in model.parameters()]),
                        strict=True):
        p.grad = piece.view_as(p).clone()


def clipped(g: Tensor, max_norm: float | None, how: str, sizes: tuple[int, ...]) -> Tensor:
    """g clipped to max_norm as `how` says (see Flaw.clip)."""
    if max_norm is None or how == "none":
        return g
    if how == "each":
        return torch.cat([clipped(piece, max_norm, "global", ()) for piece in g.split(sizes)])
    ratio = max_norm / (g.norm() + 1e-6)
    return g * (ratio if how == "always" else ratio.clamp(max=1.0))


def simulate(run: Course, flaw: Flaw) -> Tensor:
    """The parameters after each step (S, N) of AdamW written with `flaw`."""
    theta, m, v = run.theta.clone(), torch.zeros_like(run.theta), torch.zeros_like(run.theta)
    decayed = torch.ones_like(theta) if flaw.decay == "every" else run.matrices
    lam = WEIGHT_DECAY * decayed * (flaw.decay != "none")  # λ, (N,)
    beta1, beta2 = BETAS
    w1, w2 = (1 - beta1, 1 - beta2) if flaw.swapped else BETAS
    thetas = []
    for t, (g, lr) in enumerate(zip(run.grads, LRS, strict=True), 1):
        g = clipped(g, run.max_norm, flaw.clip, run.sizes)
        if flaw.decay == "coupled":
            g = g + lam * theta
        elif flaw.decay == "no lr":
            theta = theta - lam * theta
        elif flaw.decay != "after":
            theta = theta - lr * lam * theta
        if flaw.fresh:
            m, v = torch.zeros_like(m), torch.zeros_like(v)
        m, v = w1 * m + (1 - w1) * g, w2 * v + (1 - w2) * g * g
        c1, c2 = (1 - beta1**t, 1 - beta2**t) if flaw.corrected else (1.0, 1.0)
        if flaw.eps == "inside":
            denominator = (v / c2 + EPS).sqrt()
        elif flaw.eps == "early":
            denominator = (v.sqrt() + EPS) / math.sqrt(c2)
        else:
            denominator = (v / c2).sqrt() + EPS
        theta = theta - lr * (m / c1) / denominator
        if flaw.decay == "after":
            theta = theta - lr * lam * theta
        thetas.append(theta)
    return torch.stack(thetas)  # (S, N)


def torch_steps(run: Course) -> tuple[Tensor, list, tuple]:
    """torch.optim.AdamW on the same model and gradients, with clip_grad_norm_: the parameters
    after each step (S, N), the norms, and the state (t, m, v) as the book's AdamW keeps it."""
    model = small_model()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LRS[0], betas=BETAS, eps=EPS, foreach=False)
    thetas, norms = [], []
    for g, lr in zip(run.grads, LRS, strict=True):
        set_gradients(model, g)
        for group in optimizer.param_groups:
            group["lr"] = lr
        norms.append(torch.nn.utils.clip_grad_norm_(params, run.max_norm or math.inf))
        optimizer.step()
        thetas.append(flat(model))
    state = [optimizer.state[p] for p in params]
    return torch.stack(thetas), norms, (len(LRS), *(torch.cat([s[name].reshape(-1) for s in state])
                                                    for name in ("exp_avg", "exp_avg_sq")))


def learner_steps(s: Subject, run: Course) -> tuple[Tensor, list, tuple]:
    """The learner's AdamW.step, in the book's AdamW, on the same model and gradients."""
    model = small_model()
    optimizer = s.owner()(model, lr=LRS[0], weight_decay=WEIGHT_DECAY, betas=BETAS, eps=EPS)
    thetas, norms = [], []
    for step, (g, lr) in enumerate(zip(run.grads, LRS, strict=True), 1):
        optimizer.zero_grad()
        set_gradients(model, g)
        optimizer.lr = lr
        try:
            norms.append(optimizer.step(run.max_norm))
        except ZeroDivisionError as err:
            raise Mismatch(f"step {step} raised ZeroDivisionError: {err}",
                           NOT_FINITE if step == 1 else "") from None
        except RuntimeError as err:
            if "leaf Variable" not in str(err):
                raise
            raise Mismatch(f"step {step} raised RuntimeError: {err}", NO_GRAD) from None
        thetas.append(flat(model))
    return torch.stack(thetas), norms, tuple(getattr(optimizer, name, None)
                                             for name in ("t", "exp_avg", "exp_avg_sq"))


def compare_parameters(got: Tensor, want: Tensor, run: Course) -> None:
    """The learner's parameters step by step against torch's, naming a known mistake."""
    for step, (theta, expected) in enumerate(zip(got, want, strict=True), 1):
        if not torch.isfinite(theta).all():
            raise Mismatch(f"the parameters hold NaN or inf after step {step}",
                           NOT_FINITE if step == 1 else "")
        if step == 1 and torch.equal(theta, run.theta):
            raise Mismatch("the parameters are unchanged after a step", NOT_IN_PLACE)
        if not same(theta, expected, atol=1e-7):
            gap = (theta - expected).abs().max().item()
            wrong = {hint: simulate(run, flaw) for hint, flaw in FLAWS.items()}
            hint = next((h for h, out in wrong.items() if same(got, out, atol=1e-5)), "")
            raise Mismatch(f"the parameters after step {step} of {len(got)} differ from "
                           f"torch.optim.AdamW's by up to {gap:.3g}", hint)


def compare_norms(got: list, want: list[Tensor], max_norm: float | None) -> None:
    """Each step's returned norm against clip_grad_norm_'s (the norm before clipping)."""
    for step, (norm, expected) in enumerate(zip(got, want, strict=True), 1):
        if not (isinstance(norm, Tensor) and norm.numel() == 1 or isinstance(norm, float | int)):
            what = f"a tensor of shape {tuple(norm.shape)}" if isinstance(norm, Tensor) else \
                type(norm).__name__
            raise Mismatch(f"step {step} returned {what}, not the gradient norm", NO_NORM)
        value, target = float(norm), expected.item()
        if math.isclose(value, target, rel_tol=1e-9):
            continue
        hint = ""
        if max_norm is not None and math.isclose(value, min(target, max_norm), rel_tol=1e-5):
            hint = NORM_AFTER
        elif math.isclose(value, target**2, rel_tol=1e-9):
            hint = SQUARED
        raise Mismatch(f"step {step} returned the norm {value:.6g}, expected {target:.6g} (what "
                       f"torch.nn.utils.clip_grad_norm_ returns)", hint or NO_NORM)


def adamw_steps(s: Subject, max_norm: float | None) -> None:
    run = course(max_norm)
    (thetas, norms, _), (want_thetas, want_norms, _) = learner_steps(s, run), torch_steps(run)
    compare_parameters(thetas, want_thetas, run)
    compare_norms(norms, want_norms, max_norm)


def adamw_matches_torch(s: Subject) -> None:
    """five steps with a changing lr, unclipped, against torch.optim.AdamW (decay on matrices)"""
    adamw_steps(s, None)


def adamw_clips(s: Subject) -> None:
    """with max_norm: g clipped by its global norm as clip_grad_norm_, the norm before returned"""
    adamw_steps(s, MAX_NORM)


def adamw_keeps_its_state(s: Subject) -> None:
    """the step count and the moments kept in self.t, self.exp_avg and self.exp_avg_sq"""
    run = course(MAX_NORM)
    (t, *moments), (steps, *expected) = learner_steps(s, run)[2], torch_steps(run)[2]
    if t != steps:
        raise Mismatch(f"self.t is {t!r} after {steps} steps", STATE)
    for name, moment, want in zip(("exp_avg", "exp_avg_sq"), moments, expected, strict=True):
        if not isinstance(moment, Tensor) or not same(moment, want):
            raise Mismatch(f"self.{name} after {steps} steps is not torch.optim.AdamW's {name}",
                           STATE)


# --- the learning-rate schedule ---

OFF_BY_ONE = ("the warmup is off by one: step 0 is the first step and trains too, at 1 / warmup; "
              "use (step + 1) / warmup, which reaches 1 at the last warmup step")
NO_WARMUP = "there is no warmup: while step < warmup the factor is (step + 1) / warmup"
FROM_ZERO = ("progress is counted from step 0: count it from the end of warmup, "
             "(step - warmup) / (cfg.steps - warmup)")
NOT_ZERO = ("the cosine does not reach 0 at cfg.steps: progress is (step - warmup) / "
            "(cfg.steps - warmup), which is 1 at cfg.steps")
EARLY = ("the cosine reaches 0 a step early: progress is (step - warmup) / (cfg.steps - warmup), "
         "1 at cfg.steps itself")
RESTART = ("after cfg.steps the cosine rises again (a restart): keep progress at 1 from there, "
           "min(progress, 1)")
LINEAR = "a linear decay: the schedule is half a cosine, 0.5 (1 + cos(π progress))"
NEGATIVE = "the factor goes below 0: take 0.5 (1 + cos(π progress)), which runs from 1 to 0"
QUARTER = "a quarter of a cosine: take 0.5 (1 + cos(π progress)), half a cosine from 1 to 0"
IGNORED = "cfg.schedule is ignored: cosine, constant (1 after warmup) and inverse_sqrt differ"
UNSCALED = ("inverse_sqrt is not scaled to 1 at the end of warmup: sqrt(warmup / step), not "
            "1 / sqrt(step)")
SQRT_SHIFTED = "inverse_sqrt is off by one: sqrt(warmup / step), which is 1 at step = warmup"
ZERO_WARMUP = ("with warmup_steps 0 there is no warmup to divide by, and inverse_sqrt counts "
               "warmup and step as at least 1: sqrt(max(warmup, 1) / max(step, 1))")


def train_cfg(schedule: str = "cosine", warmup: int = 10, steps: int = 100) -> TrainConfig:
    return TrainConfig(schedule=schedule, warmup_steps=warmup, steps=steps)


def factors(s: Subject, cfg: TrainConfig, steps: range) -> Tensor:
    """The learner's factor at each of `steps`, as float64 numbers."""
    values = []
    for step in steps:
        try:
            value = s(step, cfg)
        except ZeroDivisionError:
            raise Mismatch(f"lr_factor({step}, cfg) divides by zero ({described(cfg)})",
                           ZERO_WARMUP if cfg.warmup_steps == 0 else "") from None
        try:
            values.append(float(value))
        except (TypeError, ValueError):
            raise Mismatch(f"lr_factor({step}, cfg) returned {type(value).__name__}, not a number",
                           "return the factor, one float") from None
    return torch.tensor(values, dtype=DTYPE)


def described(cfg: TrainConfig) -> str:
    return f"{cfg.schedule}, warmup_steps {cfg.warmup_steps}, steps {cfg.steps}"


def compare_factors(s: Subject, cfg: TrainConfig, steps: range,
                    wrong: list[tuple[str, Tensor]]) -> None:
    """The learner's factors over `steps` equal the book's, else the first that differs and
    the hint of the known wrong version (hint, its factors) that gives them all."""
    got = factors(s, cfg, steps)
    want = torch.tensor([lr_factor(step, cfg) for step in steps], dtype=DTYPE)
    if same(got, want, atol=1e-12):
        return
    k = int((~torch.isclose(got, want, rtol=1e-6, atol=1e-12)).nonzero()[0])
    hint = next((h for h, out in wrong if same(got, out, atol=1e-12)), "")
    raise Mismatch(f"lr_factor({steps[k]}, cfg) is {got[k].item():.6g}, expected "
                   f"{want[k].item():.6g} ({described(cfg)})", hint)


def at(steps: range) -> Tensor:
    return torch.tensor(list(steps), dtype=DTYPE)


def schedule_warms_up(s: Subject) -> None:
    """warmup: (step + 1) / warmup at steps 0 .. warmup - 1, for every schedule"""
    steps = range(10)
    wrong = [(OFF_BY_ONE, at(steps) / 10), (NO_WARMUP, torch.ones(10, dtype=DTYPE))]
    for schedule in ("cosine", "constant", "inverse_sqrt"):
        compare_factors(s, train_cfg(schedule), steps, wrong)


def cosine(progress: Tensor) -> Tensor:
    return 0.5 * (1 + torch.cos(math.pi * progress))


def cosine_decays_to_zero(s: Subject) -> None:
    """cosine: 1 at the end of warmup, 0.5 halfway, 0 at cfg.steps and after it"""
    steps = range(10, 141)  # warmup 10, 100 steps, and 40 more
    x = at(steps)
    progress = ((x - 10) / 90).clamp(max=1)
    wrong = [(FROM_ZERO, cosine((x / 100).clamp(max=1))), (NOT_ZERO, cosine((x - 10) / 100)),
             (EARLY, cosine(((x - 10) / 89).clamp(max=1))), (RESTART, cosine((x - 10) / 90)),
             (RESTART, cosine((x - 10) / 90 % 1)), (LINEAR, 1 - progress),
             (NEGATIVE, torch.cos(math.pi * progress)),
             (QUARTER, torch.cos(math.pi / 2 * progress))]
    compare_factors(s, train_cfg("cosine"), steps, wrong)


def other_schedules(s: Subject) -> None:
    """constant stays at 1 after warmup; inverse_sqrt is sqrt(warmup / step), 1 at its end"""
    steps = range(10, 120)
    x = at(steps)
    ignored = (IGNORED, cosine(((x - 10) / 90).clamp(max=1)))
    compare_factors(s, train_cfg("constant"), steps, [ignored])
    compare_factors(s, train_cfg("inverse_sqrt"), steps, [
        ignored, (UNSCALED, 1 / x.sqrt()), (SQRT_SHIFTED, (10 / (x + 1)).sqrt())])


def schedule_without_warmup(s: Subject) -> None:
    """warmup_steps 0: no division by zero; each schedule from step 0"""
    for schedule in ("cosine", "constant", "inverse_sqrt"):
        compare_factors(s, train_cfg(schedule, warmup=0, steps=50), range(51),
                        [(ZERO_WARMUP, torch.zeros(51, dtype=DTYPE))])


# --- exact match and token accuracy ---

FIELDS = ("count", "exact", "correct_tokens", "total_tokens")
PAIRS = (([1, 2, 3], [1, 2, 3]), ([1, 2, 4], [1, 2, 3]), ([1, 2, 3, 4], [1, 2, 3]),
         ([1, 2], [1, 2, 3]), ([4, 1, 2], [1, 2]), ([], [5, 6]), ([], []))
PREFIX = ("a prediction and a target of different lengths count as exact (one a prefix of the "
          "other): compare the whole lists, pred == target, lengths too")
EXTRA_FREE = ("extra tokens are free: the accuracy is over max(len(pred), len(target)) tokens, "
              "so that each extra or missing token counts as wrong")
MISSING_FREE = ("missing tokens are free: the accuracy is over max(len(pred), len(target)) "
                "tokens, so that each extra or missing token counts as wrong")
ANYWHERE = ("tokens are matched wherever they are: count them position by position, "
            "sum(p == t for p, t in zip(pred, target))")
REPLACED = ("each add replaces the counts: add to them (+=), so that they sum over every pair "
            "scored")


def pair_hint(field: str, value: object, pred: list[int], target: list[int]) -> str:
    """The mistake that gives `value` for `field` after one add(pred, target), if known."""
    known = {"exact": [(PREFIX, all(p == t for p, t in zip(pred, target))),
                       (PREFIX, sum(p == t for p, t in zip(pred, target)) == len(target))],
             "total_tokens": [(EXTRA_FREE, len(target)), (MISSING_FREE, len(pred)),
                              (EXTRA_FREE, min(len(pred), len(target)))],
             "correct_tokens": [(ANYWHERE, sum(t in pred for t in target))],
             "count": [("count each pair scored: self.count += 1", 0)]}
    return next((hint for hint, wrong in known.get(field, []) if value == wrong), "")


def add_scores_one_pair(s: Subject) -> None:
    """one pair at a time: count, exact, correct_tokens and total_tokens as the book's"""
    for pred, target in PAIRS:
        stats, book = s.owner()(), LengthStats()
        stats.add(list(pred), list(target))
        book.add(list(pred), list(target))
        for field in FIELDS:
            value, expected = getattr(stats, field), getattr(book, field)
            if value != expected:
                raise Mismatch(f"after add({pred}, {target}) to new stats, {field} is {value!r}, "
                               f"expected {expected}", pair_hint(field, value, pred, target))


def add_accumulates(s: Subject) -> None:
    """several pairs in a row: the counts add up over them all, as exact_match reads them"""
    stats, book, last = s.owner()(), LengthStats(), LengthStats()
    for pred, target in PAIRS:
        stats.add(list(pred), list(target))
        book.add(list(pred), list(target))
    last.add(*PAIRS[-1])
    for field in FIELDS:
        value, expected = getattr(stats, field), getattr(book, field)
        if value != expected:
            replaced = value == getattr(last, field) and expected != getattr(last, field)
            raise Mismatch(f"after {len(PAIRS)} pairs, {field} is {value!r}, expected "
                           f"{expected}", REPLACED if replaced else "")


CHECKS = {
    "AdamW.step": (adamw_matches_torch, adamw_clips, adamw_keeps_its_state),
    "lr_factor": (schedule_warms_up, cosine_decays_to_zero, other_schedules,
                  schedule_without_warmup),
    "LengthStats.add": (add_scores_one_pair, add_accumulates),
}
