"""Truncated importance sampling (`LossConfig.tis_cap`) on a hand-worked example."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algo.objective import LossConfig, LossInputs
from .batches import grpo_loss

# One completion of 3 real tokens (+1 padding). The trainer's and the sampler's probabilities of the tokens:
TRAINER_P = np.array([[0.5, 0.2, 0.6, 0.9]])
SAMPLER_P = np.array([[0.25, 0.2, 0.1, 0.3]])   # ratios 2, 1, 6 (and padding)
MASK = np.array([[1, 1, 1, 0]])
ADVANTAGE = 0.5


def _loss(cap, logp):
  inputs = LossInputs(logp_BxT=logp, old_logp_BxT=None, ref_logp_BxT=None,
                      advantages_B=jnp.array([ADVANTAGE]), mask_BxT=jnp.asarray(MASK),
                      sampler_logp_BxT=jnp.log(jnp.asarray(SAMPLER_P, jnp.float32)))
  return grpo_loss(inputs, LossConfig(beta=0.0, tis_cap=cap))


def test_capped_weights_scale_each_tokens_policy_term_by_hand():
  logp = jnp.log(jnp.asarray(TRAINER_P, jnp.float32))
  loss, metrics = _loss(3.0, logp)
  # On-policy the ratio is 1, so each token's clipped term is -A = -0.5; the weights are min(2, 3) = 2,
  # min(1, 3) = 1 and min(6, 3) = 3: terms -1, -0.5, -1.5, whose token mean is -1.
  np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["tis/weight"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["tis/capped"], 1 / 3, rtol=1e-6)
  # d loss / d logp_t = -A * w_t / 3 (the weights carry no gradient); padding gets none.
  grad = jax.grad(lambda lp: _loss(3.0, lp)[0])(logp)
  np.testing.assert_allclose(grad, [[-1 / 3, -1 / 6, -0.5, 0.0]], rtol=1e-6)


def test_without_a_cap_the_loss_ignores_the_sampler():
  logp = jnp.log(jnp.asarray(TRAINER_P, jnp.float32))
  loss, metrics = _loss(None, logp)
  np.testing.assert_allclose(loss, -ADVANTAGE, rtol=1e-6)
  assert "tis/weight" not in metrics


def test_a_cap_without_sampler_log_probs_is_an_error():
  inputs = LossInputs(jnp.zeros((1, 2)), None, None, jnp.zeros(1), jnp.ones((1, 2)))
  with pytest.raises(ValueError, match="sampler_logp_BxT is None"):
    grpo_loss(inputs, LossConfig(tis_cap=2.0))
