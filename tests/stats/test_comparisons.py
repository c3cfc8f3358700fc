"""Comparisons and planning against independent references: scipy's paired t test, pairs counted by hand,
Holm by hand, and the power of the t test by simulation."""
import math

import numpy as np
import pytest
from scipy import stats

from grpo_jax.stats import comparisons, intervals, power


def test_paired_matches_scipys_paired_t_test_and_interval():
  rng = np.random.default_rng(0)
  a, b = rng.normal(0.5, 0.05, 6), rng.normal(0.47, 0.05, 6)
  result = comparisons.paired(a - b)
  assert result.p == pytest.approx(stats.ttest_rel(a, b).pvalue)
  lo, hi = stats.t.interval(0.95, 5, loc=np.mean(a - b), scale=stats.sem(a - b))
  assert (result.interval.lo, result.interval.hi) == (pytest.approx(lo), pytest.approx(hi))
  assert result.interval.method == "t" and result.n == 6 and result.wins == int((a > b).sum())
  assert comparisons.paired([0.1]).p != comparisons.paired([0.1]).p  # one seed: no test (NaN)


def test_the_t_half_width_is_scipys_interval_elementwise_and_nan_below_two_seeds():
  # the report's bands over seeds at every step go through it (sweep/figures.py's interval_band)
  std, n = np.array([0.1, 0.2, 0.3]), np.array([1, 2, 5])
  half = intervals.t_half_width(std, n)
  assert np.isnan(half[0])
  np.testing.assert_allclose(half[1:], [stats.t.interval(0.95, k - 1, scale=s / np.sqrt(k))[1] for s, k in
                                        zip(std[1:], n[1:])], rtol=1e-12)


def test_paired_differences_without_spread_give_no_p_and_no_interval():
  for same in ([0.1, 0.1, 0.1], [0.0, 0.0], [0.7 - 0.6, 0.9 - 0.8]):  # the last equal up to rounding
    result = comparisons.paired(same)
    assert result.p is None and result.interval == intervals.NO_INTERVAL and result.n == len(same)
    assert result.mean == pytest.approx(same[0])
  assert comparisons.holm([None, 0.01])[1] == pytest.approx(0.01)  # no p: not counted in the family


def test_holm_by_hand_and_its_rejections_match_the_step_down_rule():
  assert comparisons.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
  adjusted = comparisons.holm([0.2, math.nan, 0.001])
  assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.002)
  rng = np.random.default_rng(1)
  for _ in range(200):
    p = rng.random(int(rng.integers(1, 8))) ** 3
    order = np.argsort(p)
    rejected = set()
    for rank, i in enumerate(order):  # Holm: reject in order while p_(i) <= alpha / (m - i)
      if p[i] > 0.05 / (p.size - rank):
        break
      rejected.add(int(i))
    assert {i for i, q in enumerate(comparisons.holm(p)) if q <= 0.05} == rejected


def test_probability_of_improvement_counts_same_seed_pairs_and_ties_half():
  variant, baseline = [0.5, 0.4, 0.7, 0.2, math.nan], [0.3, 0.4, 0.8, 0.1, 0.5]
  # same-seed pairs: higher, tie, lower, higher (the NaN pair left out): (1 + 1/2 + 0 + 1) / 4, where counting every
  # run against every other run (the unpaired U / nm) would give 11 / 20
  estimate, ci = comparisons.improvement([a - b for a, b in zip(variant, baseline)])
  assert estimate == 0.625 and ci.lo <= estimate <= ci.hi and ci.method == "percentile bootstrap"
  assert comparisons.improvement([-0.1, -0.2])[0] == 0.0
  assert comparisons.improvement([0.1]) == (1.0, intervals.NO_INTERVAL)


def test_two_level_bootstrap_splits_the_spread_between_seeds_and_prompts():
  rng = np.random.default_rng(2)
  prompts = rng.random(200) < 0.5
  same_everywhere = np.tile(prompts, (5, 1)).astype(float)  # 5 seeds that answer identically: no seed spread
  result = comparisons.two_level(same_everywhere)
  assert result.seed_sd == pytest.approx(0, abs=1e-12) and result.seed_share == pytest.approx(0, abs=1e-12)
  assert result.prompt_sd > 0
  assert result.mean == pytest.approx(prompts.mean())
  seed_levels = np.repeat(np.array([[0.2], [0.4], [0.6], [0.5]]), 100, axis=1)  # no prompt spread
  result = comparisons.two_level(seed_levels)
  assert result.prompt_sd == pytest.approx(0, abs=1e-12) and result.seed_share == 1
  # the seed-only standard error is the bootstrap's sd of the mean of 4 values: about std(ddof=0) / 2
  assert result.seed_sd == pytest.approx(np.std([0.2, 0.4, 0.6, 0.5]) / 2, rel=0.1)
  assert result.interval.lo < result.mean < result.interval.hi


def test_power_of_the_paired_t_test_matches_simulation():
  sd, n = 0.03, 5
  effect = power.min_detectable_effect(sd, n)
  assert power.power(effect, sd, n) == pytest.approx(0.8, abs=1e-6)
  rng = np.random.default_rng(3)
  d = rng.normal(effect, sd, (20_000, n))
  rejected = stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05
  assert rejected.mean() == pytest.approx(0.8, abs=0.015)
  # unpaired: two groups of n
  effect = power.min_detectable_effect(sd, n, paired=False)
  x, y = rng.normal(effect, sd, (20_000, n)), rng.normal(0, sd, (20_000, n))
  assert (stats.ttest_ind(x, y, axis=1).pvalue < 0.05).mean() == pytest.approx(0.8, abs=0.015)


def test_seeds_needed_is_the_first_n_with_enough_power():
  for effect, sd in ((0.02, 0.02), (0.01, 0.03), (0.05, 0.01)):
    n = power.seeds_needed(effect, sd)
    assert power.power(effect, sd, n) >= 0.8 and (n == 2 or power.power(effect, sd, n - 1) < 0.8)
  assert power.min_detectable_effect(0.02, 3) > power.min_detectable_effect(0.02, 20)


def test_prompts_for_width_with_wilson_and_with_a_spread():
  n = power.prompts_for_width(0.1, p=0.5)
  assert power.wilson_width(n, 0.5) <= 0.1 < power.wilson_width(n - 1, 0.5)
  ci = intervals.wilson(128, 256)  # the closed form is scipy's Wilson at whole successes
  assert power.wilson_width(256, 0.5) == pytest.approx(ci.hi - ci.lo)
  n = power.prompts_for_width(0.05, sd=0.3)
  assert 2 * 1.959964 * 0.3 / math.sqrt(n) <= 0.05 < 2 * 1.959964 * 0.3 / math.sqrt(n - 1)


@pytest.mark.parametrize("trials", [1, 2, 7, 64, 256, 1319])
@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
def test_wilson_closed_form_equals_scipys_binomtest_interval(trials, level):
  for successes in sorted({0, 1, trials // 3, trials // 2, trials - 1, trials}):
    want = stats.binomtest(successes, trials).proportion_ci(confidence_level=level, method="wilson")
    got = intervals.wilson(successes, trials, level)
    assert (got.lo, got.hi) == pytest.approx((want.low, want.high), abs=1e-12), (successes, trials)
  assert intervals.wilson(0, 0) == intervals.NO_INTERVAL


def test_a_trainer_imports_no_scipy():
  # Every evaluation takes a Wilson interval; scipy.stats would cost a trainer 0.5 s of its start (stats/intervals.py).
  import subprocess
  import sys
  code = ("import sys, grpo_jax.train.loop, numpy as np; from grpo_jax.stats import intervals; "
          "intervals.over_prompts(np.array([0., 1., 1.])); print('scipy' in sys.modules)")
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
