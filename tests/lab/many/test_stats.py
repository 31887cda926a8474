"""The small statistics of `minitfm sweep` and `minitfm compare` (lab/many/stats.py) against
known answers: Student's t tables, the coverage of the t interval on normal samples, Wilson's
and Newcombe's published values, permutation p-values against a plain enumeration written
here, the test's false alarms under no difference, the textbook sample sizes. No training; a
few seconds."""

import itertools
import math
import random
from statistics import mean

import pytest

from minitfm.lab.many import stats
from minitfm.lab.many.stats import (
    detectable,
    detectable_rate,
    mean_interval,
    newcombe,
    paired_test,
    seeds_for_any_test,
    seeds_needed,
    seeds_needed_rate,
    smallest_p,
    t_cdf,
    t_quantile,
    unpaired_test,
    welch_interval,
    wilson,
)


@pytest.mark.parametrize("df, q975, q80", [
    (1, 12.706, 1.376), (2, 4.303, 1.061), (3, 3.182, 0.978), (5, 2.571, 0.920),
    (7, 2.365, 0.896), (10, 2.228, 0.879), (30, 2.042, 0.854), (120, 1.980, 0.845),
])
def test_t_quantiles_match_the_tables(df, q975, q80):
    assert t_quantile(0.975, df) == pytest.approx(q975, abs=1e-3)
    assert t_quantile(0.80, df) == pytest.approx(q80, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-3)
    assert t_cdf(0.0, df) == pytest.approx(0.5)


def test_t_cdf_is_the_cauchy_at_one_degree_and_the_normal_far_out():
    for x in (-3.0, -0.5, 0.2, 4.0):
        assert t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi)
    assert t_cdf(1.96, 5000) == pytest.approx(0.975, abs=1e-3)


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_t_interval_covers_the_mean_of_normal_samples_95_times_in_100(n):
    """2,000 samples of n from N(10, 3²): the interval holds 10 in 95% of them (binomial sd
    0.5%: 2% is four of them)."""
    rng = random.Random(n)
    draws = 2000
    covered = 0
    for _ in range(draws):
        interval = mean_interval([rng.gauss(10, 3) for _ in range(n)])
        covered += interval.lo <= 10 <= interval.hi
    assert covered / draws == pytest.approx(0.95, abs=0.02)


def test_welch_covers_a_difference_of_unequal_spreads():
    rng = random.Random(1)
    covered = 0
    for _ in range(2000):
        found = welch_interval([rng.gauss(5, 1) for _ in range(6)],
                               [rng.gauss(3, 4) for _ in range(8)])
        covered += found.lo <= 2 <= found.hi
    assert covered / 2000 == pytest.approx(0.95, abs=0.02)


def test_one_run_has_a_value_and_no_interval_and_alike_runs_a_point():
    assert mean_interval([0.5]).lo is None and mean_interval([0.5]).mean == 0.5
    assert mean_interval([]).mean is None
    same = mean_interval([3.0, 3.0, 3.0])
    assert (same.lo, same.mean, same.hi) == (3.0, 3.0, 3.0)


@pytest.mark.parametrize("k, n, lo, hi", [
    (8, 8, 0.6756, 1.0), (0, 8, 0.0, 0.3244), (5, 10, 0.2366, 0.7634),
    (81, 263, 0.2553, 0.3662),  # Newcombe 1998's example 81/263
])
def test_wilson_matches_published_values(k, n, lo, hi):
    assert wilson(k, n) == pytest.approx((lo, hi), abs=1e-4)


def test_newcombe_matches_his_paper():
    """Newcombe 1998, Table II (b): 56/70 - 48/80, method 10: 0.0524 to 0.3339."""
    found = newcombe((56, 70), (48, 80))
    assert found.mean == pytest.approx(0.2)
    assert (found.lo, found.hi) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def enumerate_paired(differences):
    """The sign-flip p-value written out plainly: every pattern of signs, as likely."""
    observed = abs(mean(differences))
    flips = [abs(mean([s * d for s, d in zip(signs, differences)]))
             for signs in itertools.product((1, -1), repeat=len(differences))]
    return sum(f >= observed - 1e-12 for f in flips) / len(flips)


def enumerate_unpaired(a, b):
    """The relabelling p-value written out plainly: every choice of which runs are A's."""
    pooled, hits, splits = [*a, *b], 0, 0
    observed = abs(mean(a) - mean(b))
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        group = [pooled[i] for i in chosen]
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        hits += abs(mean(group) - mean(rest)) >= observed - 1e-12
        splits += 1
    return hits / splits


def test_permutation_p_values_equal_the_enumeration():
    assert paired_test([1.0, 2.0, 3.0])[0] == 2 / 8  # all positive: the two extreme patterns
    assert unpaired_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])[0] == 2 / 20
    rng = random.Random(7)
    for _ in range(20):
        a = [round(rng.gauss(0, 1), 1) for _ in range(rng.randint(2, 6))]  # ties included
        b = [round(rng.gauss(0.5, 1), 1) for _ in range(rng.randint(2, 6))]
        assert unpaired_test(a, b)[0] == pytest.approx(enumerate_unpaired(a, b))
        diffs = [round(rng.gauss(0.3, 1), 1) for _ in range(rng.randint(2, 9))]
        assert paired_test(diffs)[0] == pytest.approx(enumerate_paired(diffs))


def test_monte_carlo_comes_close_to_the_exact_p_value(monkeypatch):
    rng = random.Random(3)
    a, b = [rng.gauss(0, 1) for _ in range(8)], [rng.gauss(0.8, 1) for _ in range(8)]
    diffs = [x - y for x, y in zip(a, b)]
    exact = unpaired_test(a, b)[0], paired_test(diffs)[0]
    monkeypatch.setattr(stats, "EXACT_LIMIT", 10)
    drawn = unpaired_test(a, b), paired_test(diffs)
    assert "Monte Carlo" in drawn[0][1] and "Monte Carlo" in drawn[1][1]
    assert [p for p, _ in drawn] == pytest.approx(exact, abs=0.01)  # sd of 20,000 draws: 0.002
    assert unpaired_test(a, b) == drawn[0]  # a fixed seed: the same p every time


def test_under_no_difference_the_test_errs_at_most_5_times_in_100():
    """400 pairs of samples from one normal distribution: p < 0.05 in about 5% of them (an
    exact test is never above its level; binomial sd 1.1%)."""
    rng = random.Random(11)
    trials = 400
    alarms = sum(unpaired_test([rng.gauss(0, 1) for _ in range(6)],
                               [rng.gauss(0, 1) for _ in range(6)])[0] < 0.05
                 for _ in range(trials))
    assert alarms / trials <= 0.05 + 0.03
    paired_alarms = sum(paired_test([rng.gauss(0, 1) for _ in range(8)])[0] < 0.05
                        for _ in range(trials))
    assert paired_alarms / trials <= 0.05 + 0.03


def test_a_large_planted_difference_is_found():
    rng = random.Random(5)
    a, b = [rng.gauss(100, 5) for _ in range(8)], [rng.gauss(200, 5) for _ in range(8)]
    assert unpaired_test(a, b)[0] == pytest.approx(2 / math.comb(16, 8))
    assert paired_test([x - y for x, y in zip(a, b)])[0] == 2 / 256


def test_too_few_seeds_can_never_reach_5_percent():
    assert smallest_p(5) == 2 / 32 and smallest_p(6) == 2 / 64
    assert smallest_p(3, 3) == 2 / 20 and smallest_p(4, 4) == 2 / 70
    assert seeds_for_any_test(True) == 6 and seeds_for_any_test(False) == 4


def test_sample_sizes_are_the_textbooks():
    """A difference of one standard deviation needs 17 runs a side (two-sample t test, 80%
    power, alpha 0.05: Cohen 1988, Table 2.4.1 gives 17 for d = 1); 16 detect about 1 sd."""
    assert seeds_needed(1.0, 1.0) == 17
    assert seeds_needed(10.0, 10.0) == 17  # the units do not matter
    assert detectable(1.0, 16, 16) == pytest.approx(1.0, abs=0.05)
    assert seeds_needed(1.0, 0.5) == pytest.approx(64, abs=1)  # Cohen: 64 for d = 0.5
    assert seeds_needed(0.0, 3.0) == 2
    assert seeds_needed(1.0, 1e-4) is None  # beyond MAX_SEEDS
    assert seeds_needed(1.0, 1e-300) is None  # and no overflow on the way


def test_rate_sizes_are_cohens():
    """Cohen 1988, Table 6.4.1: h = 0.5 needs 63 a side (80% power, alpha 0.05 two-sided)."""
    p1 = 0.5
    p2 = math.sin(math.asin(math.sqrt(p1)) + 0.25) ** 2  # h = 2 asin √p2 - 2 asin √p1 = 0.5
    assert seeds_needed_rate(p2, p1) == pytest.approx(63, abs=1)
    assert seeds_needed_rate(0.5, 0.5) is None
    assert seeds_needed_rate(0.5, 0.5 + 1e-15) is None
    smallest = detectable_rate(0.5, 63, 63)
    assert seeds_needed_rate(0.5 + smallest, 0.5) == pytest.approx(63, abs=1)
    assert 0 < detectable_rate(1.0, 8, 8) < 1  # all at target: the rate a miss or two away
