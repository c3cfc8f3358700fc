"""Planning a study from a pilot: the smallest effect n seeds detect, the seeds an effect needs, and the held-out
prompts an interval of a given width needs.

Seeds: a two-sided t test at alpha = 0.05 with power 0.8, its power computed exactly from the noncentral t
distribution (scipy.stats.nct):
  paired    (each seed of the variant against the baseline's same seed) df = n - 1, noncentrality
            effect / (sd_d / sqrt(n)), sd_d the spread of the pilot's same-seed differences;
  unpaired  (independent seeds per arm) df = 2n - 2, noncentrality effect / (sd * sqrt(2 / n)), sd the pooled
            spread of the pilot's groups.
Prompts: the smallest number of prompts whose 95% interval is at most `width` wide: Wilson's for a proportion p,
else the normal width 2 * 1.96 * sd / sqrt(n) of a per-prompt spread sd (partial credit, avg@N, pass@k).
"""
from __future__ import annotations

import math

from scipy import optimize, stats

from grpo_jax.stats.intervals import LEVEL, wilson_center_half

ALPHA, POWER = 0.05, 0.8
MAX_SEEDS = 10_000


def power(effect: float, sd: float, n: int, paired: bool = True, alpha: float = ALPHA) -> float:
  """The probability that a two-sided t test at `alpha` rejects 'no difference' for a true `effect`."""
  if n < 2:
    return math.nan
  df, se = (n - 1, sd / math.sqrt(n)) if paired else (2 * n - 2, sd * math.sqrt(2 / n))
  crit = stats.t.ppf(1 - alpha / 2, df)
  nc = abs(effect) / se
  upper, lower = stats.nct.sf(crit, df, nc), stats.nct.cdf(-crit, df, nc)
  # far in the tail scipy's noncentral t cdf underflows to NaN: that tail is then below 1e-9
  return float(upper + (0.0 if math.isnan(lower) else lower))


def min_detectable_effect(sd: float, n: int, paired: bool = True, target: float = POWER,
                          alpha: float = ALPHA) -> float:
  """The smallest effect that n seeds detect with probability `target`."""
  if n < 2 or not sd > 0:
    return math.nan
  hi = sd
  while power(hi, sd, n, paired, alpha) < target:
    hi *= 2
  return float(optimize.brentq(lambda e: power(e, sd, n, paired, alpha) - target, 0.0, hi, xtol=sd * 1e-9))


def seeds_needed(effect: float, sd: float, paired: bool = True, target: float = POWER,
                 alpha: float = ALPHA) -> int | None:
  """The fewest seeds (per arm) that detect `effect` with probability `target`; None beyond MAX_SEEDS."""
  if not sd > 0:
    return 2
  n = 2
  while power(abs(effect), sd, n, paired, alpha) < target:
    n = n + 1 if n < 64 else int(n * 1.1)
    if n > MAX_SEEDS:
      return None
  if n > 64:  # stepped by 10%: walk back to the first that suffices
    while power(abs(effect), sd, n - 1, paired, alpha) >= target:
      n -= 1
  return n


def prompts_for_width(width: float, p: float | None = None, sd: float | None = None, level: float = LEVEL) -> int:
  """The fewest prompts whose interval is at most `width` wide: Wilson's at proportion p, else normal with the
  per-prompt spread sd."""
  if p is not None:
    n = 1
    while wilson_width(n, p, level) > width:
      n *= 2
    lo, hi = n // 2 + 1, n
    while lo < hi:  # the width falls with n: the first n that fits
      mid = (lo + hi) // 2
      lo, hi = (mid + 1, hi) if wilson_width(mid, p, level) > width else (lo, mid)
    return max(hi, 1)
  z = stats.norm.ppf(0.5 + level / 2)
  return max(1, math.ceil((2 * z * sd / width) ** 2))


def wilson_width(n: int, p: float, level: float = LEVEL) -> float:
  """The width of Wilson's interval at n trials and an observed proportion p (the formula binomtest's
  proportion_ci evaluates at whole successes, here at any p, so that it falls steadily with n)."""
  return 2 * wilson_center_half(n, p, level)[1]
