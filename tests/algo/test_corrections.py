"""Off-policy corrections (grpo_jax/algo/corrections.py) on a hand-worked example: one completion of 3 real tokens
whose behaviour (sampler) probabilities differ from the policy's by the ratios 2, 1 and 6."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import errors
from grpo_jax.algo import corrections
from grpo_jax.algo.objective import LossConfig, LossInputs, validate_config
from grpo_jax.config import get_config
from grpo_jax.train.checks import validate
from tests.tolerance import assert_close_f32
from .batches import grpo_loss

POLICY_P = np.array([[0.5, 0.2, 0.6, 0.9]])     # pi_theta = pi_prox (one update per batch)
BEHAVIOUR_P = np.array([[0.25, 0.2, 0.1, 0.3]])  # ratios 2, 1, 6 (and padding)
MASK = np.array([[1, 1, 1, 0]])


def _loss(advantage, correction, logp=None, **cfg):
  logp = jnp.log(jnp.asarray(POLICY_P, jnp.float32)) if logp is None else logp
  inputs = LossInputs(logp_BxT=logp, old_logp_BxT=None, ref_logp_BxT=None, advantages_B=jnp.array([advantage]),
                      mask_BxT=jnp.asarray(MASK), sampler_logp_BxT=jnp.log(jnp.asarray(BEHAVIOUR_P, jnp.float32)))
  return grpo_loss(inputs, LossConfig(beta=0.0, correction=correction, **cfg))


def test_proximal_without_tis_ignores_the_behaviour_policy():
  loss, metrics = _loss(0.5, "proximal")
  np.testing.assert_allclose(loss, -0.5, rtol=1e-6)  # ratio 1 on every token: -A
  # The spread of pi_prox / pi_behav is logged all the same: mean (2 + 1 + 6) / 3, mean square (4 + 1 + 36) / 3.
  np.testing.assert_allclose(metrics["offpolicy/ratio"], 3.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["offpolicy/ratio_sq"], 41 / 3, rtol=1e-6)


def test_behaviour_clips_the_ratio_to_the_sampler_by_hand():
  # A = 0.5 > 0, ratios 2, 1, 6 against the behaviour policy, eps 0.2: min(rA, clip(r, 0.8, 1.2) A) =
  # 0.6, 0.5, 0.6; the loss is minus their token mean. Clipped tokens get no gradient; the middle one -A/3.
  loss, _ = _loss(0.5, "behaviour")
  np.testing.assert_allclose(loss, -1.7 / 3, rtol=1e-6)
  logp = jnp.log(jnp.asarray(POLICY_P, jnp.float32))
  grad = jax.grad(lambda lp: _loss(0.5, "behaviour", lp)[0])(logp)
  assert_close_f32(grad, np.array([[0.0, -1 / 6, 0.0, 0.0]]), ulps=8)  # a ratio, a mean: 0.25 ulps seen, 5 old atol
  # A = -0.5: min(rA, clip(r) A) = -1, -0.5, -3 (the unclipped side), loss 4.5 / 3, gradient -rA/3 per token.
  loss, _ = _loss(-0.5, "behaviour")
  np.testing.assert_allclose(loss, 1.5, rtol=1e-6)
  grad = jax.grad(lambda lp: _loss(-0.5, "behaviour", lp)[0])(logp)
  np.testing.assert_allclose(grad, [[1 / 3, 1 / 6, 1.0, 0.0]], rtol=1e-6)


def test_proximal_with_tis_is_the_decoupled_objective_by_hand():
  # Ratio 1 to pi_prox, weights min(pi_prox / pi_behav, 3) = 2, 1, 3: terms -1, -0.5, -1.5, mean -1.
  loss, metrics = _loss(0.5, "proximal", tis_cap=3.0)
  np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["tis/weight"], 2.0, rtol=1e-6)


def test_a_notebook_registers_its_own_correction():
  @corrections.register_correction("two_sided_mask_for_test", overwrite=True)
  def two_sided_mask(prox, behav, mask, cfg):  # IcePop's idea: drop tokens whose ratio leaves [0.5, 2]
    ratio = jnp.exp(prox - behav)
    keep = jnp.where(mask & (ratio >= 0.5) & (ratio <= 2.0), 1.0, 0.0)
    return prox, jax.lax.stop_gradient(keep), {}

  loss, _ = _loss(0.5, "two_sided_mask_for_test")
  np.testing.assert_allclose(loss, -1.0 / 3, rtol=1e-5)  # -0.5, -0.5 and a dropped 0, over 3 tokens
  loss, _ = _loss(0.5, two_sided_mask)  # or by object
  np.testing.assert_allclose(loss, -1.0 / 3, rtol=1e-5)


def test_settings_name_the_mistakes():
  config = get_config()
  config.grpo.correction = "behavior"
  with pytest.raises(errors.ConfigError, match="grpo.correction='behavior'"):
    validate_config(config.grpo)
  config = get_config()
  config.grpo.correction, config.grpo.tis_cap = "behaviour", 2.0
  with pytest.raises(errors.ConfigError, match=r"config.grpo.tis_cap=2.0: weights by pi_proximal"):
    validate(config)
  with pytest.raises(ValueError, match="LossConfig.tis_cap=2.0: .* with correction='behaviour'"):
    LossConfig(correction="behaviour", tis_cap=2.0)
