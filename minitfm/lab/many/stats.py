"""Statistics for a few seeds, by hand: intervals, a test, and how many seeds a difference needs.

What `minitfm sweep` and `minitfm compare` say about runs of one configuration and about two:

- **A mean's 95% interval**: Student's t (Student 1908), mean ± t(0.975, n-1) · s / √n. It is
  exact for normally distributed figures and honest at n = 3..10, where a percentile bootstrap
  is not: resampling the few values seen, it gives intervals too narrow for so few (its
  coverage falls well below 95% at n < 10; Efron & Tibshirani 1993, ch. 13-14). Two sides:
  the t interval of the paired differences, or Welch's (Welch 1947) when unpaired.
- **A success rate's 95% interval**: Wilson's score interval (Wilson 1927), which stays inside
  0..1 and is not empty at 0 of n or n of n; a difference of two rates: Newcombe's hybrid
  score interval (Newcombe 1998, method 10).
- **A test**: the permutation test (Fisher 1935; Good 2005; Ernst 2004), which assumes no
  distribution. Paired by seed, the signs of the differences are flipped; unpaired, the runs'
  labels are shuffled. Exact (every arrangement counted) up to EXACT_LIMIT arrangements, else
  MONTE_CARLO draws with a fixed seed, p = (1 + hits) / (1 + draws) (Phipson & Smyth 2010).
  Two-sided: the statistic is the absolute difference of the means.
- **The smallest detectable difference** at 80% power and two-sided alpha 0.05, from the pooled
  standard deviation: (t(0.975, df) + t(0.80, df)) · s · √(1/n_a + 1/n_b) (the usual
  normal-theory formula with t quantiles; e.g. van Belle 2008, ch. 2). It treats the runs as
  unpaired, so it is conservative for paired seeds. For rates, Cohen's arcsine effect size h
  (Cohen 1988, ch. 6). Inverted, it says how many seeds a difference needs.

No scipy (not a dependency): Student's t distribution comes from its finite series
(Abramowitz & Stegun 1964, 26.7.3-4), its quantiles by bisection. No torch here.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass
from statistics import NormalDist, mean, stdev

LEVEL = 0.95  # of every interval
ALPHA = 0.05  # two-sided, of every test and of the detectable difference
POWER = 0.80  # of the detectable difference and the seeds needed
EXACT_LIMIT = 20_000  # arrangements counted one by one; more: Monte Carlo
MONTE_CARLO = 20_000  # random arrangements drawn when there are more
SEED = 0  # of those draws: the same p-value every time
MAX_SEEDS = 100_000  # "more than this" is the honest answer beyond


# --- Student's t ---

def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (a fraction is rounded down: a
    wider interval), from the finite series of Abramowitz & Stegun 26.7.3-4 in
    θ = atan(|x| / √df); beyond 1000 degrees of freedom, the normal distribution."""
    df = max(1, math.floor(df))
    if df > 1000:
        return NormalDist().cdf(x)
    theta = math.atan(abs(x) / math.sqrt(df))
    c2, series, term = math.cos(theta) ** 2, 0.0, 1.0
    if df % 2 == 1:  # A = (2/π)(θ + sinθ cosθ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + ...))
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        inside = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)
    else:  # A = sinθ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + ...)
        for k in range(1, df // 2 + 1):
            series += term
            term *= c2 * (2 * k - 1) / (2 * k)
        inside = math.sin(theta) * series
    return 0.5 + math.copysign(inside / 2, x)  # `inside` is P(|T| <= |x|)


@functools.cache  # an interval's 97.5% point is asked again for every figure of a table
def t_quantile(p: float, df: float) -> float:
    """The x with P(T <= x) = p, 0 < p < 1, by bisection on `t_cdf`."""
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2 * high
    for _ in range(100):  # halves the bracket down to the float's resolution
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


# --- intervals ---

@dataclass
class Interval:
    """A figure over n runs: its mean and the ends of its 95% interval (None below 2 runs)."""

    n: int
    mean: float | None
    lo: float | None = None
    hi: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "mean": self.mean, "lo": self.lo, "hi": self.hi}


def mean_interval(values: list[float]) -> Interval:
    """The mean and its 95% Student's t interval: mean ± t(0.975, n-1) · s / √n."""
    n = len(values)
    if n < 2:
        return Interval(n, values[0] if values else None)
    centre = mean(values)
    half = t_quantile(1 - (1 - LEVEL) / 2, n - 1) * stdev(values) / math.sqrt(n)
    return Interval(n, centre, centre - half, centre + half)


def welch_interval(a: list[float], b: list[float]) -> Interval:
    """mean(a) - mean(b) and its 95% Welch interval (Welch 1947: unequal spreads, degrees of
    freedom from Welch-Satterthwaite, rounded down); n is that of the smaller side."""
    difference = mean(a) - mean(b) if a and b else None
    if len(a) < 2 or len(b) < 2:
        return Interval(min(len(a), len(b)), difference)
    va, vb = stdev(a) ** 2 / len(a), stdev(b) ** 2 / len(b)
    if va + vb == 0:  # every run alike on each side: no spread to allow for
        return Interval(min(len(a), len(b)), difference, difference, difference)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(1 - (1 - LEVEL) / 2, df) * math.sqrt(va + vb)
    return Interval(min(len(a), len(b)), difference, difference - half, difference + half)


def z_value(p: float) -> float:
    """The standard normal quantile: z_value(0.975) = 1.96."""
    return NormalDist().inv_cdf(p)


def wilson(successes: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate successes / n (Wilson 1927), n >= 1."""
    z, rate = z_value(1 - (1 - LEVEL) / 2), successes / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_interval(successes: int, n: int) -> Interval:
    """A success rate with its Wilson interval."""
    if n == 0:
        return Interval(0, None)
    return Interval(n, successes / n, *wilson(successes, n))


def newcombe(a: tuple[int, int], b: tuple[int, int]) -> Interval:
    """rate a - rate b, each (successes, n), and its 95% hybrid score interval from the two
    Wilson intervals (Newcombe 1998, method 10)."""
    (ka, na), (kb, nb) = a, b
    pa, pb = ka / na, kb / nb
    (la, ua), (lb, ub) = wilson(ka, na), wilson(kb, nb)
    d = pa - pb
    return Interval(min(na, nb), d, d - math.hypot(pa - la, ub - pb),
                    d + math.hypot(ua - pa, pb - lb))


# --- permutation tests ---

def close_or_above(stat: float, observed: float) -> bool:
    """stat >= observed, allowing for rounding: an arrangement that is the observed one summed
    in another order must count."""
    return stat >= observed - 1e-9 * (1 + abs(observed))


def paired_test(differences: list[float]) -> tuple[float, str]:
    """The sign-flip permutation test of paired differences (mean 0 under no difference): the
    p-value, and how it was found. Each seed's difference may as well have had the other sign."""
    n, observed = len(differences), abs(sum(differences))
    if 2 ** n <= EXACT_LIMIT:
        signs = itertools.product((1, -1), repeat=n)
        hits = sum(close_or_above(abs(sum(s * d for s, d in zip(flip, differences))), observed)
                   for flip in signs)
        return hits / 2 ** n, f"exact over {2 ** n:,} sign flips"
    rng = random.Random(SEED)
    hits = sum(close_or_above(abs(sum(d if rng.random() < 0.5 else -d for d in differences)),
                              observed) for _ in range(MONTE_CARLO))
    return (1 + hits) / (1 + MONTE_CARLO), f"Monte Carlo, {MONTE_CARLO:,} sign flips"


def unpaired_test(a: list[float], b: list[float]) -> tuple[float, str]:
    """The permutation test of mean(a) - mean(b): the runs' labels shuffled, every split of the
    pooled figures into groups of len(a) and len(b) as likely as the one observed."""
    pooled, na, nb = [*a, *b], len(a), len(b)
    total, observed = sum(pooled), abs(mean(a) - mean(b))
    splits = math.comb(na + nb, na)

    def stat(chosen: float) -> float:  # |mean of a group of na - mean of the rest|
        return abs(chosen / na - (total - chosen) / nb)

    if splits <= EXACT_LIMIT:
        hits = sum(close_or_above(stat(sum(group)), observed)
                   for group in itertools.combinations(pooled, na))
        return hits / splits, f"exact over {splits:,} splits"
    rng = random.Random(SEED)
    hits = sum(close_or_above(stat(sum(rng.sample(pooled, na))), observed)
               for _ in range(MONTE_CARLO))
    return (1 + hits) / (1 + MONTE_CARLO), f"Monte Carlo, {MONTE_CARLO:,} splits"


def smallest_p(na: int, nb: int | None = None) -> float:
    """The smallest p-value the exact test can give: 2 / 2^n paired (nb None), one or two
    extreme splits in C(na + nb, na) unpaired. Above ALPHA, no difference can be detected."""
    if nb is None:
        return min(1.0, 2 / 2 ** na)
    return min(1.0, (2 if na == nb else 1) / math.comb(na + nb, na))


def seeds_for_any_test(paired: bool) -> int:
    """The fewest seeds (a side) whose exact test can reach p < ALPHA at all."""
    n = 1
    while smallest_p(n, None if paired else n) > ALPHA:
        n += 1
    return n


# --- what n can detect, and what a difference needs ---

def pooled_sd(a: list[float], b: list[float]) -> float | None:
    """√(((n_a - 1) s_a² + (n_b - 1) s_b²) / (n_a + n_b - 2)); None without 2 runs a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    return math.sqrt(((len(a) - 1) * stdev(a) ** 2 + (len(b) - 1) * stdev(b) ** 2)
                     / (len(a) + len(b) - 2))


def detectable(sd: float, na: int, nb: int) -> float:
    """The smallest difference of means found with POWER at two-sided ALPHA by a two-sample
    test: (t(1 - α/2, df) + t(power, df)) · sd · √(1/n_a + 1/n_b), df = n_a + n_b - 2."""
    df = na + nb - 2
    return (t_quantile(1 - ALPHA / 2, df) + t_quantile(POWER, df)) * sd * math.sqrt(1 / na + 1 / nb)


def seeds_needed(sd: float, effect: float) -> int | None:
    """The seeds a side (both sides alike) for which `detectable` reaches `effect`; None when
    beyond MAX_SEEDS."""
    if sd == 0:
        return 2  # no spread: two runs a side show any difference (and give an interval)
    ratio = (z_value(1 - ALPHA / 2) + z_value(POWER)) * sd / effect
    if 2 * ratio * ratio > MAX_SEEDS:  # (a product, not **: a tiny effect must not overflow)
        return None
    n = max(2, math.floor(2 * ratio * ratio))  # the normal answer; t asks a little more
    while n <= MAX_SEEDS and detectable(sd, n, n) > effect:
        n += 1
    return n if n <= MAX_SEEDS else None


def arcsine(rate: float) -> float:
    """Cohen's φ = 2 asin √p: on this scale a rate's spread no longer depends on the rate."""
    return 2 * math.asin(math.sqrt(rate))


def detectable_rate(rate: float, na: int, nb: int) -> float | None:
    """The smallest difference from `rate` of a second rate found with POWER at ALPHA: Cohen's
    h = (z(1 - α/2) + z(power)) · √(1/n_a + 1/n_b), taken towards the middle; None when even
    0 against 1 falls short of h."""
    h = (z_value(1 - ALPHA / 2) + z_value(POWER)) * math.sqrt(1 / na + 1 / nb)
    phi = arcsine(rate)
    other = phi - h if phi >= math.pi / 2 else phi + h
    if not 0 <= other <= math.pi:
        return None
    return abs(math.sin(other / 2) ** 2 - rate)


def seeds_needed_rate(rate_a: float, rate_b: float) -> int | None:
    """Seeds a side to tell rate_a from rate_b with POWER at ALPHA: 2 ((z + z) / h)², h
    Cohen's effect size; None when the rates are equal or that is beyond MAX_SEEDS."""
    h = abs(arcsine(rate_a) - arcsine(rate_b))
    if h == 0:
        return None
    ratio = (z_value(1 - ALPHA / 2) + z_value(POWER)) / h
    return math.ceil(2 * ratio * ratio) if 2 * ratio * ratio <= MAX_SEEDS else None
