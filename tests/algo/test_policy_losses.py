import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from grpo_jax.algo import registry
from grpo_jax.algo.objective import LossConfig, LossInputs
from grpo_jax.algo.policy_losses import cispo, clipped_surrogate, importance_log_ratio
from tests.tolerance import assert_close_f32
from . import reference as ref
from .batches import CASES, grpo_loss, make_batch


def _clean_inputs(b):
  mask = jnp.asarray(b["mask"])
  z = lambda x: jnp.where(mask, jnp.asarray(x), 0.0)
  return LossInputs(z(b["logp"]), z(b["old"]), z(b["ref"]), jnp.asarray(b["adv"]), mask, z(b["ent"]))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_token_loss_and_clip_metrics_match_reference(case, seed):
  kw = CASES[case]
  b = make_batch(seed)
  cfg = LossConfig(**kw)
  fn = registry.get_loss(cfg.policy_loss)
  loss, metrics = fn(_clean_inputs(b), cfg)
  loss = np.asarray(loss)
  lows, highs = [], []
  for i, n in enumerate(b["lengths"]):
    exp_loss, low, high = ref.policy_term(b["logp"][i, :n], b["old"][i, :n], float(b["adv"][i]), kw)
    # A few roundings of r·A per token (~1 ulp of the row's largest measured); 128 keeps the old atol at rows
    # whose largest loss is ~0.14.
    assert_close_f32(loss[i, :n], exp_loss, ulps=128)
    lows.append(low); highs.append(high)
  n_tok = sum(b["lengths"])
  for name, flags in [("low", lows), ("high", highs), ("region", [l | h for l, h in zip(lows, highs)])]:
    s, c = metrics[f"clip_ratio/{name}"]
    assert float(c) == n_tok
    assert float(s) == sum(int(f.sum()) for f in flags), name
  assert sum(int(f.sum()) for f in highs + lows) > 0     # the random ratios do hit the clip range


def test_dual_clip_metric_and_cap():
  mask = jnp.ones((3, 1), bool)
  logp = jnp.log(jnp.array([[3.0], [3.0], [0.5]]))
  x = LossInputs(logp, jnp.zeros((3, 1)), None, jnp.array([-2.0, 1.0, -1.0]), mask, None)
  loss, metrics = clipped_surrogate(x, LossConfig(delta=2.0))
  # r=3, Â=−2: PPO loss r·|Â| = 6 is capped at δ|Â| = 4. Â=+1: clipped at 1.2. r=0.5, Â=−1: clipped at 0.8.
  np.testing.assert_allclose(np.asarray(loss)[:, 0], [4.0, -1.2, 0.8], rtol=1e-6)
  assert [float(v) for v in metrics["clip_ratio/dual"]] == [1.0, 3.0]
  assert float(metrics["clip_ratio/low"][0]) == 1.0 and float(metrics["clip_ratio/high"][0]) == 1.0


def test_sequence_ratio_is_length_normalized():
  mask = jnp.array([[1, 1, 1, 0], [0, 0, 0, 0]], bool)
  logp, old = jnp.array([[0.3, -0.6, 0.9, 7.0], [1.0] * 4]), jnp.zeros((2, 4))
  lr = np.asarray(importance_log_ratio(logp, old, mask, "sequence"))
  np.testing.assert_allclose(lr[0], 0.2, rtol=1e-6)
  assert np.all(lr[1] == 0.0)
  with pytest.raises(ValueError, match="importance_level must be 'token' or 'sequence'"):
    importance_log_ratio(logp, old, mask, "tokens")


def test_cispo_rejects_sequence_level():
  b = make_batch(0)
  with pytest.raises(ValueError, match="cispo.*token-level"):
    cispo(_clean_inputs(b), LossConfig(policy_loss="cispo", importance_level="sequence"))


def _unclipped(inputs, cfg):
  """−r·Â: the surrogate without any clipping (a user-defined loss, plugged in by object)."""
  r = jnp.exp(importance_log_ratio(inputs.logp_BxT, inputs.old_logp_BxT, inputs.mask_BxT, cfg.importance_level))
  return -r * inputs.advantages_B[:, None], {}


B, T = 4, 3
floats = lambda lo, hi, n: st.lists(st.floats(lo, hi, width=32), min_size=n, max_size=n)


@settings(max_examples=40, deadline=None)
@given(logp=floats(-4.0, 0.0, B * T), shift=floats(-1.5, 1.5, B * T), adv=floats(-2.0, 2.0, B),
       lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
       eps=st.sampled_from([(0.2, None), (0.2, 0.28), (0.05, 0.1)]),
       level=st.sampled_from(["token", "sequence"]),
       aggregation=st.sampled_from(["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]))
def test_property_clipping_never_increases_the_objective(logp, shift, adv, lengths, eps, level, aggregation):
  logp = jnp.array(logp, jnp.float32).reshape(B, T)
  mask = jnp.arange(T)[None] < jnp.array(lengths)[:, None]
  x = LossInputs(logp, logp + jnp.array(shift, jnp.float32).reshape(B, T), None, jnp.array(adv, jnp.float32),
                 mask, None)
  common = dict(epsilon_low=eps[0], epsilon_high=eps[1], importance_level=level, aggregation=aggregation,
                beta=0.0)
  unclipped = float(grpo_loss(x, LossConfig(policy_loss=_unclipped, **common))[0])
  clipped = float(grpo_loss(x, LossConfig(**common))[0])
  dual = float(grpo_loss(x, LossConfig(delta=1.3, **common))[0])
  tol = 1e-5 * (1 + abs(unclipped))
  # loss = −objective: clipping can only raise the loss; the dual clip only lowers the clipped loss.
  assert clipped >= unclipped - tol
  assert dual <= clipped + tol


def test_registry_by_name_and_by_object():
  b = make_batch(4)
  x = LossInputs(jnp.asarray(b["logp"]), jnp.asarray(b["old"]), None, jnp.asarray(b["adv"]),
                 jnp.asarray(b["mask"]), None)

  def half_clipped(inputs, cfg):                        # defined "in a notebook"
    loss, metrics = clipped_surrogate(inputs, cfg)
    return 0.5 * loss, metrics

  registry.register_loss("test_half_clipped")(half_clipped)
  assert "test_half_clipped" in registry.list_losses()
  assert {"clipped", "cispo"} <= set(registry.list_losses())
  full = grpo_loss(x, LossConfig(beta=0.0))[0]
  by_name = grpo_loss(x, LossConfig(policy_loss="test_half_clipped", beta=0.0))[0]
  by_object = grpo_loss(x, LossConfig(policy_loss=half_clipped, beta=0.0))[0]
  np.testing.assert_allclose([by_name, by_object], [0.5 * full, 0.5 * full], rtol=1e-6)

  def half_clipped(inputs, cfg):                        # the notebook cell is run again: same name, new object
    return clipped_surrogate(inputs, cfg)
  registry.register_loss("test_half_clipped")(half_clipped)
  assert registry.get_loss("test_half_clipped") is half_clipped

  with pytest.raises(ValueError, match="'clipped' is already registered"):
    registry.register_loss("clipped")(lambda inputs, cfg: None)
  with pytest.raises(ValueError, match=r"unknown policy loss 'clipd', not one of \[.*'clipped'.*"
                                       r"did you mean 'clipped'"):
    grpo_loss(x, LossConfig(policy_loss="clipd"))
  registry.register_loss("test_half_clipped", overwrite=True)(_unclipped)
  assert registry.get_loss("test_half_clipped") is _unclipped
