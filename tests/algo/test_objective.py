import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algo import advantages
from grpo_jax.algo.entropy import entropy_from_logits
from grpo_jax.algo.objective import LossConfig, LossInputs, grpo_objective
from tests.tolerance import assert_close_f32
from . import reference as ref
from .batches import CASES, grpo_loss, make_batch

# Compared with float64 / transformers: full float32 matmuls (TF32 by default on NVIDIA GPUs).
pytestmark = pytest.mark.usefixtures("float32_matmuls")

AGGS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]


def _inputs(b, old=True, ref_=True, ent=True):
  j = jnp.asarray
  return LossInputs(j(b["logp"]), j(b["old"]) if old else None, j(b["ref"]) if ref_ else None, j(b["adv"]),
                    j(b["mask"]), j(b["ent"]) if ent else None)


def _check(b, kw, old=True, ref_=True, ent=True):
  cfg = LossConfig(**kw)
  loss, metrics = grpo_loss(_inputs(b, old, ref_, ent), cfg)
  full_kw = dict(dict(kl_estimator="k3", beta=0.04, cispo_epsilon_high=5.0, epsilon_high=None), **kw)
  exp_loss, exp_metrics = ref.objective(b["logp"], b["old"] if old else None, b["ref"] if ref_ else None,
                                        np.float64(b["adv"]), b["lengths"], b["ent"] if ent else None,
                                        full_kw)
  assert np.isfinite(float(loss))
  # Means over tokens of terms of size ~1 (advantages times ratios, KL, entropies), rounded at that size even where
  # the mean is near 0: 16 ulps of max(1, |value|) (1.1 seen; the old atol 1e-6 is 8).
  assert_close_f32(float(loss), exp_loss, ulps=16, scale=max(1.0, abs(exp_loss)))
  for name, value in exp_metrics.items():
    assert_close_f32(float(metrics[name]), value, ulps=16, scale=max(1.0, abs(value)), err_msg=name)


@pytest.mark.parametrize("case, aggregation", list(itertools.product(sorted(CASES), AGGS)))
def test_policy_losses_x_aggregations_match_reference(case, aggregation):
  _check(make_batch(10), dict(CASES[case], aggregation=aggregation))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("aggregation", AGGS)
def test_kl_estimators_match_reference(estimator, aggregation):
  _check(make_batch(11), dict(policy_loss="clipped", importance_level="token", epsilon_low=0.2,
                              kl_estimator=estimator, beta=0.3, aggregation=aggregation))


@pytest.mark.parametrize("kw", [
    dict(entropy_coef=0.01),
    dict(top_entropy_quantile=0.2),
    dict(top_entropy_quantile=0.5, entropy_coef=-0.05, aggregation="token_mean"),
    dict(beta=0.0, aggregation="seq_mean_token_sum_norm", max_completion_length=9),
])
def test_entropy_options_and_max_length_match_reference(kw):
  base = dict(policy_loss="clipped", importance_level="token", epsilon_low=0.2, aggregation="seq_mean_token_mean")
  _check(make_batch(12), dict(base, **kw))


def test_old_none_and_ref_none_match_reference():
  b = make_batch(13)
  base = dict(policy_loss="clipped", importance_level="token", epsilon_low=0.2, aggregation="token_mean")
  _check(b, base, old=False)
  _check(b, base, ref_=False)
  _, metrics = grpo_loss(_inputs(b, ref_=False, ent=False), LossConfig())
  assert "kl" not in metrics and "entropy" not in metrics


def test_beta_zero_reports_kl_but_does_not_add_it():
  b = make_batch(14)
  with_ref, m = grpo_loss(_inputs(b), LossConfig(beta=0.0))
  without_ref, _ = grpo_loss(_inputs(b, ref_=False), LossConfig(beta=0.0))
  assert float(with_ref) == float(without_ref)
  assert float(m["kl"]) > 0.0


def test_jit_with_static_config_matches_eager():
  b = make_batch(15)
  cfg = LossConfig(epsilon_high=0.28, aggregation="token_mean")
  jitted = jax.jit(grpo_objective, static_argnames="cfg")(_inputs(b), cfg=cfg)
  eager = grpo_objective(_inputs(b), cfg)
  np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6)
  assert jitted[1] == eager[1]


@pytest.mark.parametrize("aggregation", AGGS)
def test_gradient_coefficient_is_deepseekmath_a16(aggregation):
  """μ=1 (π_old = sg(π_θ)), clipped + k3: ∂loss/∂logp_{i,t} = −(Â_i + β(π_ref/π_θ − 1)) · w_{i,t}."""
  b = make_batch(20)
  beta = 0.1
  cfg = LossConfig(beta=beta, kl_estimator="k3", aggregation=aggregation, max_completion_length=7)
  x = _inputs(b, old=False, ent=False)
  grad = jax.grad(lambda logp: grpo_loss(x._replace(logp_BxT=logp), cfg)[0])(x.logp_BxT)
  grad = np.asarray(grad, np.float64)
  lengths = b["lengths"]
  nonempty, tokens = sum(n > 0 for n in lengths), sum(lengths)
  for i, n in enumerate(lengths):
    w = {"seq_mean_token_mean": 1.0 / (max(n, 1) * nonempty), "token_mean": 1.0 / tokens,
         "seq_mean_token_sum_norm": 1.0 / (nonempty * 7)}[aggregation]
    rho = np.exp(np.float64(b["ref"][i, :n]) - np.float64(b["logp"][i, :n]))   # π_ref / π_θ
    coefficient = float(b["adv"][i]) + beta * (rho - 1.0)
    # A ratio times a weight: 1 ulp of the row's largest seen; 1024 keeps the old atol at rows whose largest
    # gradient is ~1e-3 (and is the old rtol 1e-4).
    assert_close_f32(grad[i, :n], -coefficient * w, ulps=1024)
    assert np.all(grad[i, n:] == 0.0)                                     # padding (NaN) gets no gradient


def test_gspo_and_cispo_gradients_at_mu_1():
  """At r = 1 every surrogate has the REINFORCE gradient −Â·w; GSPO spreads it as 1/|o_i| per token."""
  b = make_batch(21)
  x = _inputs(b, old=False, ref_=False, ent=False)
  g = lambda cfg: np.asarray(jax.grad(lambda logp: grpo_loss(x._replace(logp_BxT=logp), cfg)[0])(x.logp_BxT))
  token = g(LossConfig(beta=0.0))
  # Other programs for the same -A·w (equal here): a few roundings of the largest.
  assert_close_f32(g(LossConfig(beta=0.0, importance_level="sequence")), token, ulps=8)
  assert_close_f32(g(LossConfig(beta=0.0, policy_loss="cispo")), token, ulps=8)


# --- split-batch exactness on a tiny linear "policy": logp = log_softmax(x·W)[target] -------------------------

F, V = 4, 7


@jax.jit
def _policy(W_FxV, x_BxTxF, y_BxT):
  logits = jnp.einsum("btf,fv->btv", x_BxTxF, W_FxV)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits), y_BxT[..., None], axis=-1)[..., 0]
  return logp, entropy_from_logits(logits)


@functools.lru_cache
def _rollout(seed, B=16, T=6, G=4):
  rng = np.random.default_rng(seed)
  W = jnp.asarray(rng.normal(size=(F, V)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(B, T, F)), jnp.float32)
  y = jnp.asarray(rng.integers(0, V, size=(B, T)))
  lengths = rng.integers(0, T + 1, size=B)
  lengths[:3] = [0, 1, T]
  mask = jnp.asarray(np.arange(T)[None] < lengths[:, None])
  old, _ = _policy(W + 0.3 * jnp.asarray(rng.normal(size=(F, V)), jnp.float32), x, y)
  ref_logp, _ = _policy(W + 0.5 * jnp.asarray(rng.normal(size=(F, V)), jnp.float32), x, y)
  rewards = jnp.asarray(rng.integers(0, 2, size=B), jnp.float32)
  adv = advantages.compute_advantages(rewards, G)          # over the WHOLE rollout batch, before splitting
  return W, x, y, old, ref_logp, adv, mask


def _loss_sum(W, cfg, x, y, old, ref_logp, adv, mask):
  logp, ent = _policy(W, x, y)
  s, d, metrics = grpo_objective(LossInputs(logp, old, ref_logp, adv, mask, ent), cfg)
  return s, (d, metrics)


_grad_sum = jax.jit(jax.grad(_loss_sum, has_aux=True), static_argnums=1)


@pytest.mark.parametrize("aggregation", AGGS)
def test_four_micro_batches_give_the_whole_batch_gradient(aggregation):
  W, *batch = _rollout(30)
  cfg = LossConfig(beta=0.04, epsilon_high=0.28, entropy_coef=0.01, aggregation=aggregation)

  g_whole, (d_whole, whole_metrics) = _grad_sum(W, cfg, *batch)
  whole = g_whole / d_whole                                     # gradient of the whole-batch loss sum/denom
  g_sum, d_sum, m_sum, naive = 0.0, 0.0, {}, 0.0
  for k in range(0, 16, 4):
    g, (d, metrics) = _grad_sum(W, cfg, *[a[k:k + 4] for a in batch])
    g_sum, d_sum = g_sum + g, d_sum + d
    naive = naive + g / d / 4
    for name, (s, c) in metrics.items():
      old_s, old_c = m_sum.get(name, (0.0, 0.0))
      m_sum[name] = (old_s + s, old_c + c)
  accumulated = g_sum / d_sum
  assert float(jnp.max(jnp.abs(whole))) > 1e-3
  # Sums over 96 tokens of per-token gradients that partly cancel, grouped differently: 32 ulps of the largest.
  assert_close_f32(accumulated, whole, ulps=32)
  # ... and it is the gradient of grpo_loss itself:
  def batch_loss(W):
    logp, ent = _policy(W, batch[0], batch[1])
    return grpo_loss(LossInputs(logp, *batch[2:], ent), cfg)[0]
  direct = jax.jit(jax.grad(batch_loss))(W)
  assert_close_f32(direct, whole, ulps=32)

  assert float(whole_metrics["clip_ratio/region"][0]) > 0
  for name, (s, c) in whole_metrics.items():
    # Sums over the same tokens grouped differently: 1.6 ulps of the metric seen, 8 the old atol.
    assert_close_f32(m_sum[name][0] / m_sum[name][1], s / c, ulps=16, err_msg=name)

  # The test can fail: averaging micro-batch gradients, each normalized by its own denominator, is wrong.
  assert not np.allclose(naive, whole, rtol=1e-3, atol=1e-6)


def test_nan_padding_gives_finite_values_and_gradients():
  b = make_batch(40)
  x = _inputs(b)
  for cfg in [LossConfig(), LossConfig(policy_loss="cispo", aggregation="token_mean"),
              LossConfig(importance_level="sequence", top_entropy_quantile=0.3, entropy_coef=0.1)]:
    f = lambda logp, old, ref_logp, ent: grpo_loss(x._replace(logp_BxT=logp, old_logp_BxT=old,
                                                              ref_logp_BxT=ref_logp, entropy_BxT=ent), cfg)[0]
    loss, grads = jax.value_and_grad(f, argnums=(0, 1, 2, 3))(x.logp_BxT, x.old_logp_BxT, x.ref_logp_BxT,
                                                             x.entropy_BxT)
    assert np.isfinite(float(loss))
    for g in grads:
      assert np.all(np.isfinite(np.asarray(g)))
      assert np.all(np.asarray(g)[~b["mask"]] == 0.0)


def test_empty_batch_is_zero_not_nan():
  B, T = 3, 4
  x = LossInputs(jnp.full((B, T), jnp.nan), None, jnp.zeros((B, T)), jnp.ones(B), jnp.zeros((B, T), bool))
  loss, metrics = grpo_loss(x, LossConfig())
  assert float(loss) == 0.0 and all(float(v) == 0.0 for v in metrics.values())


@pytest.mark.parametrize("change, message", [
    (dict(old_logp_BxT=jnp.zeros((3, 5))), r"old_logp_BxT has shape \(3, 5\), but logp_BxT has shape \(3, 4\)"),
    (dict(ref_logp_BxT=jnp.zeros((4, 4))), "ref_logp_BxT has shape"),
    (dict(mask_BxT=jnp.ones((3,))), "mask_BxT has shape"),
    (dict(advantages_B=jnp.ones((3, 4))), r"advantages_B has shape \(3, 4\), expected \(3,\)"),
    (dict(advantages_B=jnp.ones(12)), "advantages_B has shape"),
    (dict(logp_BxT=jnp.zeros(4)), r"logp_BxT must be \[B, T\]"),
])
def test_bad_input_shapes(change, message):
  x = LossInputs(jnp.zeros((3, 4)), None, None, jnp.ones(3), jnp.ones((3, 4), bool), None)._replace(**change)
  with pytest.raises(ValueError, match=message):
    grpo_objective(x, LossConfig())


def test_entropy_options_need_entropy():
  x = LossInputs(jnp.zeros((3, 4)), None, None, jnp.ones(3), jnp.ones((3, 4), bool), None)
  for cfg in [LossConfig(entropy_coef=0.1), LossConfig(top_entropy_quantile=0.2)]:
    with pytest.raises(ValueError, match="entropy_BxT is None"):
      grpo_objective(x, cfg)


def test_policy_loss_with_wrong_shape_is_named():
  x = LossInputs(jnp.zeros((3, 4)), None, None, jnp.ones(3), jnp.ones((3, 4), bool), None)
  with pytest.raises(ValueError, match=r"returned shape \(3,\), expected \(3, 4\)"):
    grpo_objective(x, LossConfig(policy_loss=lambda inputs, cfg: (jnp.zeros(3), {})))


@pytest.mark.parametrize("kwargs, message", [
    (dict(kl_estimator="k4"), "unknown KL estimator 'k4'"),
    (dict(aggregation="mean"), "unknown aggregation 'mean'"),
    (dict(importance_level="seq"), r"^LossConfig.importance_level='seq': not one of"),
    (dict(epsilon_low=1.0), r"^LossConfig.epsilon_low=1.0: must be in \[0, 1\)"),
    (dict(epsilon_high=-0.1), "LossConfig.epsilon_high=-0.1: must be >= 0"),
    (dict(delta=0.9), "LossConfig.delta=0.9: the dual-clip cap must be > 1"),
    (dict(beta=-1.0), "LossConfig.beta=-1.0: must be >= 0"),
    (dict(top_entropy_quantile=1.5), "LossConfig.top_entropy_quantile=1.5: must be in"),
    (dict(max_completion_length=0), "max_completion_length must be a positive int"),
    (dict(cispo_epsilon_high=0.0), "LossConfig.cispo_epsilon_high=0.0: must be > 0"),
    (dict(tis_cap=-1.0), "LossConfig.tis_cap=-1.0: must be >= 0"),
    (dict(tis_cap=2.0, correction="behaviour"), "LossConfig.tis_cap=2.0: weights by pi_proximal"),
    (dict(policy_loss=3), "policy_loss must be a registered name or a function"),
])
def test_bad_config(kwargs, message):
  with pytest.raises(ValueError, match=message):
    LossConfig(**kwargs)


def test_loss_config_takes_every_loss_knob_of_a_runs_grpo_section():
  """from_settings copies each field the two share by name (a knob added to both is carried without a line here),
  and a run's tis_cap 0 is off in both."""
  import dataclasses
  from grpo_jax.settings import GrpoSettings
  grpo = GrpoSettings(epsilon_low=0.1, epsilon_high=0.3, delta=3.0, beta=0.0, entropy_coef=0.01, tis_cap=0.0,
                      aggregation="token_mean", top_entropy_quantile=0.5, kl_estimator="k2")
  cfg = LossConfig.from_settings(grpo, 24)
  shared = [f.name for f in dataclasses.fields(LossConfig) if hasattr(grpo, f.name)]
  assert len(shared) == 13 and cfg.max_completion_length == 24 and cfg.tis_cap is None
  assert all(getattr(cfg, name) == getattr(grpo, name) for name in shared if name != "tis_cap")
  assert LossConfig(tis_cap=0.0) == LossConfig()
