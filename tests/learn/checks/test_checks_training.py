"""The training chapters' checks fail realistic wrong versions, each with the hint naming its
mistake, and pass right ones written another way."""

import math

import pytest
import torch

import minitfm.book.metrics as metrics
from minitfm.book.loop import lr_factor
from minitfm.book.optim import AdamW
from minitfm.learn.checks import training as hints
from minitfm.learn.grading import check_function


def failed_with(name, function, hint):
    grade = check_function(name, function)
    assert grade.status == "failed" and hint in grade.hint, (grade.check, grade.message, grade.hint)


# --- AdamW.step ---

def adamw_variant(**wrong):
    """The book's AdamW.step, over the flat vector, with the mistakes named in `wrong`."""
    @torch.no_grad()
    def step(self, max_norm=None):
        g = self.gradient()
        norm = torch.linalg.vector_norm(g)
        if max_norm is not None and wrong.get("clip") != "after":
            clip(g, max_norm, norm, wrong.get("clip"), self)
        if not wrong.get("t_late"):
            self.t += 1
        beta1, beta2 = self.betas
        decay(self, g, wrong.get("decay"))
        if wrong.get("swapped"):
            self.exp_avg.lerp_(g, beta1)
            self.exp_avg_sq.mul_(1 - beta2).addcmul_(g, g, value=beta2)
        else:
            self.exp_avg.lerp_(g, 1 - beta1)
            self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        c1, c2 = 1 - beta1**self.t, 1 - beta2**self.t
        if wrong.get("uncorrected"):
            c1 = c2 = 1.0
        if wrong.get("eps") == "inside":
            denominator = (self.exp_avg_sq / c2 + self.eps).sqrt()
        elif wrong.get("eps") == "early":
            denominator = (self.exp_avg_sq.sqrt() + self.eps) / math.sqrt(c2)
        else:
            denominator = (self.exp_avg_sq / c2).sqrt() + self.eps
        self.flat.addcdiv_(self.exp_avg, denominator, value=-self.lr / c1)
        if wrong.get("decay") == "after":
            self.flat.mul_(1 - self.lr * self.decay)
        if max_norm is not None and wrong.get("clip") == "after":  # clipped once used
            g.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
        if wrong.get("t_late"):
            self.t += 1
        if wrong.get("norm") == "after":
            return torch.linalg.vector_norm(g)
        return norm.square() if wrong.get("norm") == "squared" else norm
    return step


def clip(g, max_norm, norm, how, optimizer):
    if how == "always":
        g.mul_(max_norm / norm)
    elif how == "each":
        for piece in g.split([p.numel() for p in optimizer.params]):
            piece.mul_((max_norm / (piece.norm() + 1e-6)).clamp(max=1.0))
    else:
        g.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))


def decay(optimizer, g, how):
    if how == "coupled":
        g.add_(optimizer.decay * optimizer.flat)  # Adam's L2: λθ in the gradient
    elif how == "every":
        optimizer.flat.mul_(1 - optimizer.lr * optimizer.decay.max())
    elif how == "no lr":
        optimizer.flat.mul_(1 - optimizer.decay)
    elif how not in ("after", "none"):
        optimizer.flat.mul_(1 - optimizer.lr * optimizer.decay)


def test_the_variant_without_mistakes_passes():
    assert check_function("AdamW.step", adamw_variant()).status == "passed"


@pytest.mark.parametrize("wrong, hint", [
    ({"uncorrected": True}, "not bias-corrected"),
    ({"decay": "coupled"}, "added to the gradient (L2"),
    ({"decay": "every"}, "reaches every parameter"),
    ({"decay": "after"}, "applied after the update"),
    ({"decay": "no lr"}, "not scaled by the learning rate"),
    ({"decay": "none"}, "weight decay is missing"),
    ({"eps": "inside"}, "inside the square root"),
    ({"eps": "early"}, "before the bias correction"),
    ({"swapped": True}, "the wrong way round"),
    ({"t_late": True}, "increment self.t before"),
    ({"clip": "after"}, "before clipping"),
    ({"clip": "always"}, "small ones too"),
    ({"clip": "each"}, "clipped on its own"),
    ({"norm": "after"}, "the one after clipping"),
    ({"norm": "squared"}, "squared"),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.items())))
def test_wrong_adamw_fails_with_its_hint(wrong, hint):
    failed_with("AdamW.step", adamw_variant(**wrong), hint)


@torch.no_grad()
def per_parameter_step(self, max_norm=None):
    """AdamW written as many learners write it: a loop over the parameters, moments kept in
    attributes of the learner's own (`state`), clipping without clip_grad_norm_'s 1e-6."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    scale = min(1.0, max_norm / norm.item()) if max_norm is not None else 1.0
    self.t += 1
    beta1, beta2 = self.betas
    state = self.__dict__.setdefault("state", {})
    for p, g, lam in zip(self.params, grads, self.decay.split([p.numel() for p in self.params])):
        g = g * scale
        m, v = state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(beta1).add_((1 - beta1) * g)
        v.mul_(beta2).add_((1 - beta2) * g * g)
        p.mul_(1 - self.lr * lam.view_as(p))
        m_hat, v_hat = m / (1 - beta1**self.t), v / (1 - beta2**self.t)
        p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))
    return norm


def test_a_per_parameter_adamw_passes_until_its_state_is_looked_for():
    grade = check_function("AdamW.step", per_parameter_step)
    assert grade.status == "failed" and "self.exp_avg" in grade.hint, grade
    assert grade.check == hints.adamw_keeps_its_state.__doc__


def with_clip_grad_norm(self, max_norm=None):
    """Clipping by torch's own function, then the book's update."""
    norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm or math.inf)
    AdamW.step(self, None)
    return norm


def returning_a_float(self, max_norm=None):
    return AdamW.step(self, max_norm).item()


@pytest.mark.parametrize("step", [with_clip_grad_norm, returning_a_float])
def test_adamw_written_another_way_passes(step):
    grade = check_function("AdamW.step", step)
    assert grade.status == "passed", (grade.check, grade.message, grade.hint)


def test_fresh_moments_at_every_step_are_named():
    @torch.no_grad()
    def step(self, max_norm=None):
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        return AdamW.step(self, max_norm)

    failed_with("AdamW.step", step, "start from zero at every step")


def test_a_step_that_makes_a_new_flat_vector_is_named():
    @torch.no_grad()
    def step(self, max_norm=None):
        flat = self.flat
        self.flat = flat.clone()  # the parameters are views of the old one
        return AdamW.step(self, max_norm)

    failed_with("AdamW.step", step, "update self.flat in place")


def test_an_update_that_records_gradients_is_named():
    def step(self, max_norm=None):  # no @torch.no_grad(), parameters updated one by one
        for p in self.params:
            p.sub_(self.lr * p.grad)
        return torch.linalg.vector_norm(self.gradient())

    failed_with("AdamW.step", step, "@torch.no_grad()")


# --- lr_factor ---

def schedule_variant(warmup_rule=None, progress_rule=None, curve=None, inverse_sqrt=None):
    """The book's lr_factor with one rule replaced: each takes (step, cfg)."""
    def factor(step, cfg):
        warmup = cfg.warmup_steps
        if step < warmup:
            return warmup_rule(step, warmup) if warmup_rule else (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        if cfg.schedule == "inverse_sqrt":
            return inverse_sqrt(step, warmup) if inverse_sqrt else \
                math.sqrt(max(warmup, 1) / max(step, 1))
        progress = progress_rule(step, cfg) if progress_rule else \
            min((step - warmup) / max(cfg.steps - warmup, 1), 1.0)
        return curve(progress) if curve else 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def test_the_schedule_variant_without_mistakes_passes():
    assert check_function("lr_factor", schedule_variant()).status == "passed"


@pytest.mark.parametrize("variant, hint", [
    (schedule_variant(warmup_rule=lambda s, w: s / w), "off by one"),
    (schedule_variant(warmup_rule=lambda s, w: 1.0), "there is no warmup"),
    (schedule_variant(progress_rule=lambda s, c: min(s / c.steps, 1.0)), "counted from step 0"),
    (schedule_variant(progress_rule=lambda s, c: (s - c.warmup_steps) / c.steps),
     "does not reach 0 at cfg.steps"),
    (schedule_variant(progress_rule=lambda s, c: min((s - c.warmup_steps)
                                                     / (c.steps - c.warmup_steps - 1), 1.0)),
     "a step early"),
    (schedule_variant(progress_rule=lambda s, c: (s - c.warmup_steps) / (c.steps - c.warmup_steps)),
     "a restart"),
    (schedule_variant(progress_rule=lambda s, c: (s - c.warmup_steps)
                      / (c.steps - c.warmup_steps) % 1.0), "a restart"),
    (schedule_variant(curve=lambda p: 1 - p), "a linear decay"),
    (schedule_variant(curve=lambda p: math.cos(math.pi * p)), "below 0"),
    (schedule_variant(curve=lambda p: math.cos(math.pi / 2 * p)), "a quarter of a cosine"),
    (schedule_variant(inverse_sqrt=lambda s, w: 1 / math.sqrt(s)), "not scaled to 1"),
    (schedule_variant(inverse_sqrt=lambda s, w: math.sqrt(w / (s + 1))),
     "inverse_sqrt is off by one"),
    (schedule_variant(inverse_sqrt=lambda s, w: math.sqrt(w / s)), "with warmup_steps 0"),
    (schedule_variant(inverse_sqrt=lambda s, w: math.sqrt(w / max(s, 1))), "with warmup_steps 0"),
], ids=["step/warmup", "no warmup", "progress from 0", "not to 0", "early", "restart",
        "modulo restart", "linear", "negative", "quarter", "1/sqrt(step)", "sqrt shifted",
        "divides by zero", "zero without warmup"])
def test_wrong_schedule_fails_with_its_hint(variant, hint):
    failed_with("lr_factor", variant, hint)


def test_a_schedule_that_ignores_cfg_schedule_is_named():
    def factor(step, cfg):
        return lr_factor(step, cfg.model_copy(update={"schedule": "cosine"}))

    failed_with("lr_factor", factor, "cfg.schedule is ignored")


def test_a_schedule_returning_a_list_fails_in_words():
    grade = check_function("lr_factor", lambda step, cfg: [lr_factor(step, cfg)])
    assert grade.status == "failed" and "one float" in grade.hint


# --- LengthStats.add ---

def add_variant(exact=None, correct=None, total=None, replace=False, count=True):
    """The book's LengthStats.add with one count done another way: each takes (pred, target)."""
    def add(self, pred, target):
        scores = {"count": int(count),
                  "exact": exact(pred, target) if exact else pred == target,
                  "correct_tokens": correct(pred, target) if correct else
                  sum(p == t for p, t in zip(pred, target)),
                  "total_tokens": total(pred, target) if total else max(len(pred), len(target))}
        for field, value in scores.items():
            setattr(self, field, value if replace else getattr(self, field) + value)
    return add


def test_the_add_variant_without_mistakes_passes():
    assert check_function("LengthStats.add", add_variant()).status == "passed"


@pytest.mark.parametrize("variant, hint", [
    (add_variant(exact=lambda p, t: all(a == b for a, b in zip(p, t))), "a prefix"),
    (add_variant(exact=lambda p, t: sum(a == b for a, b in zip(p, t)) == len(t)), "a prefix"),
    (add_variant(total=lambda p, t: len(t)), "extra tokens are free"),
    (add_variant(total=lambda p, t: len(p)), "missing tokens are free"),
    (add_variant(correct=lambda p, t: sum(x in p for x in t)), "position by position"),
    (add_variant(replace=True), "replaces the counts"),
    (add_variant(count=False), "self.count += 1"),
], ids=["prefix exact", "extension exact", "over len(target)", "over len(pred)", "anywhere",
        "replaced", "no count"])
def test_wrong_length_stats_fails_with_its_hint(variant, hint):
    failed_with("LengthStats.add", variant, hint)


# --- each wrong-version test can fail: the book's own code passes the same checks ---

@pytest.mark.parametrize("name, function", [
    ("AdamW.step", AdamW.step), ("lr_factor", lr_factor),
    ("LengthStats.add", metrics.LengthStats.add)])
def test_the_books_code_passes(name, function):
    grade = check_function(name, function)
    assert grade.status == "passed", (grade.check, grade.message, grade.hint)
