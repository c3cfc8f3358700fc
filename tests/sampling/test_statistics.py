"""Sampling statistics: first-token frequencies over many draws against the exact distribution."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax.sampling import Sampler, SamplingConfig
from .conftest import teacher_forced_logits

NUM_DRAWS = 8192
ALPHA_Z = 3.0902  # standard normal quantile for alpha = 1e-3


def chi_square_critical(df: int, z: float = ALPHA_Z) -> float:
  """Upper chi-square quantile by the Wilson-Hilferty cube-root normal approximation, so that the tests need
  no scipy. At alpha=1e-3 it overstates the exact value by 1.2% at df=5, 0.6% at df=10 and 0.04% at df=100
  (e.g. df=10: 29.76 vs 29.59), which moves the test's false-alarm rate from 1e-3 to about 9e-4."""
  c = 2.0 / (9.0 * df)
  return df * (1.0 - c + z * np.sqrt(c)) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
  """Pearson's statistic and its degrees of freedom; cells with expected count < 5 are pooled into one."""
  n = counts.sum()
  expected = n * probs
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] < 5:  # a pooled cell that is itself small joins the smallest big cell
    j = np.argmin(exp[:-1])
    obs[j] += obs[-1]
    exp[j] += exp[-1]
    obs, exp = obs[:-1], exp[:-1]
  assert obs.sum() == n and np.isclose(exp.sum(), n)
  # Draws outside the support (expected 0) make the statistic infinite.
  if np.any(counts[probs == 0] > 0):
    return np.inf, len(obs) - 1
  return float(np.sum((obs - exp) ** 2 / exp)), len(obs) - 1


def truncated_softmax(logits: np.ndarray, T: float, top_k: int, top_p: float) -> np.ndarray:
  """float64 reference: softmax(logits / T), then top-k, then top-p (on the renormalized top-k), sorted."""
  z = logits / T
  p = np.exp(z - z.max())
  p /= p.sum()
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(len(p), bool)
  keep[order[:top_k] if top_k else order] = True
  q = np.where(keep, p, 0.0)
  q /= q.sum()
  sorted_q = q[order]
  in_nucleus = np.cumsum(sorted_q) - sorted_q < top_p
  keep2 = np.zeros(len(p), bool)
  keep2[order[in_nucleus]] = True
  q = np.where(keep & keep2, q, 0.0)
  return q / q.sum()


@pytest.mark.parametrize("T,top_k,top_p", [(0.8, 0, 1.0), (1.3, 12, 0.8)])
def test_first_token_frequencies_match_softmax(qwen2_pair, T, top_k, top_p):
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  prompt = [17, 4, 93, 250, 8]
  cfg = SamplingConfig(max_new_tokens=1, temperature=T, top_k=top_k, top_p=top_p)
  res = Sampler(graphdef, cfg).generate(state, [prompt] * NUM_DRAWS, jax.random.key(11))
  logits_V = teacher_forced_logits(model, res._replace(**{f: v[:1] for f, v in res._asdict().items() if v is not None}))[0, 0]
  counts = np.bincount(res.completion_BxC[:, 0], minlength=model.cfg.vocab_size)

  probs = truncated_softmax(logits_V, T, top_k, top_p)
  stat, df = chi_square(counts, probs)
  crit = chi_square_critical(df)
  print(f"T={T} top_k={top_k} top_p={top_p}: chi2={stat:.1f} df={df} critical(1e-3)={crit:.1f} "
        f"support={np.sum(probs > 0)}")
  assert df >= 5 and stat < crit

  # Power: the same draws reject a nearby wrong distribution (another temperature, or no truncation).
  wrong = truncated_softmax(logits_V, T * 1.25, top_k, top_p) if top_k == 0 else truncated_softmax(
      logits_V, T, 0, 1.0)
  wrong_stat, wrong_df = chi_square(counts, wrong)
  assert wrong_stat > chi_square_critical(wrong_df)


def test_chi_square_critical_matches_tabulated_values():
  # Tabulated upper 0.1% points of chi-square (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
  for df, exact in [(5, 20.515), (10, 29.588), (30, 59.703), (100, 149.449)]:
    assert 0 <= (chi_square_critical(df) - exact) / exact < 0.015
