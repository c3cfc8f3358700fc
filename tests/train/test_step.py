"""The jitted GRPO update against independent references: the on-policy gradient written out by hand,
a Python loop over passes and mini-batches, and exact gradient accumulation over micro-batches."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax.algo.objective import LossConfig, LossInputs, grpo_objective
from grpo_jax.model import ModelConfig, Transformer, completion_logprobs
from grpo_jax.train.step import RolloutBatch, check_prompt_runs, make_logprob_fn, make_train_step
from tests.tolerance import assert_close_f32

# Compared with float64 / transformers: full float32 matmuls (TF32 by default on NVIDIA GPUs).
pytestmark = pytest.mark.usefixtures("float32_matmuls")

B, P, N, G = 8, 5, 4, 4
TEMPERATURE = 0.7
CFG = ModelConfig(vocab_size=14, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=32)
# Two programs' updates are compared with SGD (with momentum where the state must carry across updates): it is
# linear in the gradients, so their parameters agree to a few ulps of the parameters' scale. Adam divides each
# coordinate by its own gradient's magnitude, and a gradient at its rounding error (the 1e-8s of a leaf whose
# largest is 1e-2) then takes a step that the CPU decides (issue 68).
MOMENTUM_SGD = optax.sgd(0.1, momentum=0.9)


def _batch(seed=0, params=None, graphdef=None) -> RolloutBatch:
  rng = np.random.default_rng(seed)
  prompt = rng.integers(2, CFG.vocab_size, (B, P)).astype(np.int32)
  prompt_len = rng.integers(2, P + 1, B)
  prompt_mask = (np.arange(P)[None] >= P - prompt_len[:, None]).astype(np.int32)
  prompt = prompt * prompt_mask
  completion = rng.integers(1, CFG.vocab_size, (B, N)).astype(np.int32)
  comp_len = rng.integers(1, N + 1, B)
  comp_mask = (np.arange(N)[None] < comp_len[:, None]).astype(np.int32)
  completion = completion * comp_mask
  adv = rng.normal(size=B).astype(np.float32)
  return RolloutBatch(prompt, prompt_mask, completion, comp_mask, adv, np.zeros((B, N), np.float32), None)


@pytest.fixture(scope="module")
def model_state():
  graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(3)))
  return graphdef, params


def _logp(graphdef, params, batch):
  model = nnx.merge(graphdef, params)
  return completion_logprobs(model, batch.prompt_BxP, batch.prompt_mask_BxP, batch.completion_BxC,
                             batch.completion_mask_BxC, TEMPERATURE, 128)[0]


def _copy(tree):
  return jax.tree.map(jnp.array, tree)


def _close_metrics(got, want):
  """The update's metrics from two programs: means over tokens of terms up to a log-prob of this vocabulary
  (log 14 = 2.6) or an advantage times a ratio, so rounded at that size even where the mean is near 0."""
  assert set(got) == set(want)
  for k in want:
    assert_close_f32(got[k], want[k], ulps=16, scale=max(np.log(CFG.vocab_size), abs(float(want[k]))), err_msg=k)


def test_on_policy_update_matches_hand_written_gradient_and_micro_batching_is_exact(model_state):
  graphdef, params0 = model_state
  batch = _batch(0)
  logp_ref = jax.jit(_logp, static_argnums=0)(graphdef, params0, batch)
  mask = batch.completion_mask_BxC.astype(bool)
  # Sampler log-probs that disagree with the trainer by 0.25 on one real token and by 5 on a padding token.
  sampler_logp = np.array(logp_ref)
  sampler_logp[2, 0] += 0.25
  pad_row, pad_col = np.argwhere(~mask)[0]
  sampler_logp[pad_row, pad_col] += 5.0
  batch = batch._replace(sampler_logp_BxC=sampler_logp)

  lr = 0.1
  optimizer = optax.sgd(lr)
  loss_cfg = LossConfig(beta=0.0, aggregation="seq_mean_token_mean")
  traces = []

  def build(micro):
    fn = make_train_step(graphdef, optimizer, loss_cfg, num_iterations=1, mini_batch_size=B,
                         micro_batch_size=micro, temperature=TEMPERATURE, chunk_size=128)

    def counted(*args):
      traces.append(micro)
      return fn(*args)
    return jax.jit(counted, donate_argnums=(0, 1))

  step_whole = build(B)
  params = _copy(params0)
  new_whole, _, metrics = step_whole(params, optimizer.init(params), batch)
  assert jax.tree.leaves(params)[0].is_deleted()  # donated

  # Reference: at pi_old = pi_theta the clipped surrogate's gradient is that of
  # -(1/B) sum_i A_i (1/|o_i|) sum_t logp_it  (seq_mean_token_mean, beta = 0), written out directly.
  def ref_loss(p):
    logp = _logp(graphdef, p, batch)
    per_seq = jnp.sum(jnp.where(mask, logp, 0.0), axis=1) / mask.sum(axis=1)
    return -jnp.mean(batch.advantages_B * per_seq)

  grads = jax.jit(jax.grad(ref_loss))(params0)
  expected = jax.tree.map(lambda p, g: p - lr * g, params0, grads)
  # One SGD step: p - lr * g rounds at the parameters' scale, and the two gradients' rounding, times lr * |g| < |p|,
  # adds a few ulps of it.
  assert_close_f32(new_whole, expected, ulps=8)
  np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
  # |sampler - trainer| of log-probs of size ~2.6 (log 14), each rounded by its own program at that size (equal
  # here): 512 ulps of 0.25 and 1024 of the mean's 0.012, the old atols.
  assert_close_f32(metrics["logp_mismatch"], 0.25, ulps=512)
  # The mean over real tokens: one token off by 0.25 (the padding token's 5 does not count).
  assert_close_f32(metrics["logp_mismatch_mean"], 0.25 / np.sum(np.asarray(mask) > 0), ulps=1024)
  assert set(metrics) >= {"loss", "grad_norm", "logp_mismatch", "clip_ratio/low", "clip_ratio/high",
                          "clip_ratio/region", "entropy"}

  # Four micro-batches of 2: the same update and metrics.
  step_micro = build(2)
  params = _copy(params0)
  new_micro, _, metrics_micro = step_micro(params, optimizer.init(params), batch)
  assert_close_f32(new_micro, new_whole, ulps=8)
  _close_metrics(metrics_micro, metrics)

  # A second rollout with the same shapes reuses the compiled program.
  params = _copy(params0)
  step_micro(params, optimizer.init(params), _batch(1)._replace(sampler_logp_BxC=sampler_logp))
  assert sorted(traces) == [2, B]


def test_passes_and_mini_batches_match_a_python_loop(model_state):
  graphdef, params0 = model_state
  batch = _batch(5)
  optimizer = MOMENTUM_SGD
  loss_cfg = LossConfig(beta=0.0, epsilon_low=0.2, epsilon_high=0.28, aggregation="token_mean")
  mu, mini = 2, 4

  step = jax.jit(make_train_step(graphdef, optimizer, loss_cfg, num_iterations=mu, mini_batch_size=mini,
                                 micro_batch_size=2, temperature=TEMPERATURE, chunk_size=128),
                 donate_argnums=(0, 1))
  params = _copy(params0)
  got, _, metrics = step(params, optimizer.init(params), batch)

  # Reference: old log-probs once at the sampling parameters, then mu passes over the mini-batches in order,
  # one optimizer update each on the whole mini-batch's loss (no accumulation).
  old = jax.jit(_logp, static_argnums=0)(graphdef, params0, batch)

  def mini_loss(p, m):
    sl = slice(m * mini, (m + 1) * mini)
    sub = RolloutBatch(*[None if x is None else x[sl] for x in batch])
    logp = _logp(graphdef, p, sub)
    s, d, _ = grpo_objective(LossInputs(logp, old[sl], None, sub.advantages_B, sub.completion_mask_BxC), loss_cfg)
    return s / d

  grad_fn = jax.jit(jax.grad(mini_loss), static_argnums=1)
  logp_fn = jax.jit(_logp, static_argnums=0)
  p = _copy(params0)
  opt_state = optimizer.init(p)
  clipped = tokens = 0  # TRL's clip statistic in numpy: r < 1 - eps_low with A < 0, or r > 1 + eps_high with A > 0
  for _ in range(mu):
    for m in range(B // mini):
      sl = slice(m * mini, (m + 1) * mini)
      sub = RolloutBatch(*[None if x is None else x[sl] for x in batch])
      ratio = np.exp(np.asarray(logp_fn(graphdef, p, sub), np.float64) - np.asarray(old[sl], np.float64))
      adv = np.asarray(sub.advantages_B)[:, None]
      real = np.asarray(sub.completion_mask_BxC) > 0
      clipped += np.sum(real & (((ratio < 0.8) & (adv < 0)) | ((ratio > 1.28) & (adv > 0))))
      tokens += np.sum(real)
      g = grad_fn(p, m)
      updates, opt_state = optimizer.update(g, opt_state, p)
      p = optax.apply_updates(p, updates)
  # 4 updates, each adding lr * (a momentum sum of gradients) of the parameters' size, each gradient rounded
  # differently by the two programs: 64 ulps of the parameters' scale (seen: 3).
  assert_close_f32(got, p, ulps=64)
  # The off-policy updates moved the ratio past the clip: the fraction is over every token of every update.
  assert clipped > 0
  np.testing.assert_allclose(float(metrics["clip_ratio/region"]), clipped / tokens, atol=1e-6)


def test_logprob_fn_matches_direct_computation_in_micro_batches(model_state):
  graphdef, params = model_state
  batch = _batch(2)
  fn = jax.jit(make_logprob_fn(graphdef, temperature=TEMPERATURE, chunk_size=128, micro_batch_size=2))
  got = np.asarray(fn(params, batch))
  want = np.asarray(jax.jit(_logp, static_argnums=0)(graphdef, params, batch))
  mask = batch.completion_mask_BxC.astype(bool)
  assert_close_f32(got[mask], want[mask], ulps=32)  # micro-batched: equal here, 30 ulps the old atol
  with pytest.raises(ValueError, match="micro_batch_size=3"):
    make_logprob_fn(graphdef, temperature=1.0, chunk_size=128, micro_batch_size=3)(params, batch)


def test_a_non_finite_update_is_skipped_and_counted(model_state):
  graphdef, params0 = model_state
  optimizer = optax.adam(1e-2)
  step = jax.jit(make_train_step(graphdef, optimizer, LossConfig(beta=0.0), num_iterations=1, mini_batch_size=B // 2,
                                 micro_batch_size=B // 2, temperature=TEMPERATURE, chunk_size=128))
  batch = _batch(1)
  bad = batch._replace(advantages_B=np.where(np.arange(B) < B // 2, np.nan, batch.advantages_B).astype(np.float32))
  opt_state0 = optimizer.init(params0)
  # First mini-batch NaN (skipped), second finite (applied): the result is the second update alone.
  params, opt_state, metrics = step(_copy(params0), opt_state0, bad)
  assert metrics["skipped_updates"] == 1
  good_half = jax.tree.map(lambda x: x[B // 2:], batch)
  only_second = jax.jit(make_train_step(graphdef, optimizer, LossConfig(beta=0.0), num_iterations=1,
                                        mini_batch_size=B // 2, micro_batch_size=B // 2, temperature=TEMPERATURE,
                                        chunk_size=128))
  expected, expected_opt, metrics_ok = only_second(_copy(params0), optimizer.init(params0), good_half)
  assert metrics_ok["skipped_updates"] == 0
  # The skipped mini-batch leaves no trace in Adam's state: the count exact, the moments (mu = 0.1 g and
  # nu = 0.001 g^2 of the other mini-batch's gradient, from another program) within 32 ulps of each leaf's
  # largest (64 for nu: squaring doubles g's relative error), not of each element (a mu of 1.6e-9 in a leaf
  # whose largest is 2.5e-5 differed by 1.1e-4 of itself on an AMD EPYC).
  (adam, *_), (expected_adam, *_) = opt_state, expected_opt
  assert int(adam.count) == int(expected_adam.count) == 1
  assert_close_f32(adam.mu, expected_adam.mu, ulps=32)
  assert_close_f32(adam.nu, expected_adam.nu, ulps=64)
  # Adam's first step moves a coordinate by lr * g / (|g| + eps): the rounding of g (ulps of its leaf's largest
  # gradient) moves it by up to lr * that / (|g| + eps), which where |g| is small exceeds the parameter's own.
  for p, e, mu in zip(jax.tree.leaves(params), jax.tree.leaves(expected), jax.tree.leaves(expected_adam.mu)):
    g = np.abs(np.asarray(mu)) / 0.1
    assert_close_f32(p, e, ulps=32, scale=np.abs(np.asarray(e)).max() + 1e-2 * g.max() / (g + 1e-8))
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


def _grouped(batch: RolloutBatch, group: int) -> RolloutBatch:
  """`batch` with each run of `group` rows given its first row's prompt (a GRPO rollout's layout)."""
  first = np.repeat(np.arange(0, B, group), group)
  return batch._replace(prompt_BxP=batch.prompt_BxP[first], prompt_mask_BxP=batch.prompt_mask_BxP[first])


@pytest.mark.parametrize("micro, repeats", [(4, 4), (4, 2), (2, 2)])
def test_shared_prompt_update_matches_per_row_update(model_state, micro, repeats):
  """mu = 2 passes over 2 mini-batches (old log-probs computed too), beta > 0 with reference log-probs: the
  update with each prompt run once per `repeats` rows ends at the per-row update's parameters and metrics."""
  graphdef, params0 = model_state
  batch = _grouped(_batch(7), G)
  ref = np.asarray(jax.jit(_logp, static_argnums=0)(graphdef, params0, batch)) - 0.05
  batch = batch._replace(ref_logp_BxC=ref)
  optimizer = MOMENTUM_SGD
  loss_cfg = LossConfig(beta=0.04, epsilon_high=0.28)

  def run(prompt_repeats):
    step = jax.jit(make_train_step(graphdef, optimizer, loss_cfg, num_iterations=2, mini_batch_size=4,
                                   micro_batch_size=micro, temperature=TEMPERATURE, chunk_size=128,
                                   prompt_repeats=prompt_repeats))
    params = _copy(params0)
    return step(params, optimizer.init(params), batch)

  per_row, _, metrics = run(1)
  shared, _, metrics_shared = run(repeats)
  # 4 updates (2 passes x 2 mini-batches): as in the Python loop above, 64 ulps of the parameters' scale (seen:
  # 6; with Adam, 1,000 here and beyond the old atol=2e-5 on an AMD EPYC).
  assert_close_f32(shared, per_row, ulps=64)
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(params0)))
  _close_metrics(metrics_shared, metrics)
  with pytest.raises(ValueError, match="prompt_repeats=3"):
    make_train_step(graphdef, optimizer, loss_cfg, num_iterations=1, mini_batch_size=4, micro_batch_size=micro,
                    temperature=TEMPERATURE, chunk_size=128, prompt_repeats=3)


def test_check_prompt_runs_names_the_rows_that_break_a_run():
  batch = _grouped(_batch(8), G)
  check_prompt_runs(batch, G)
  check_prompt_runs(_batch(8), 1)  # per-row: any layout
  broken = batch._replace(prompt_BxP=batch.prompt_BxP.copy())
  broken.prompt_BxP[5, -1] += 1
  with pytest.raises(ValueError, match=r"rows 4\.\.7 .* prompt_BxP"):
    check_prompt_runs(broken, G)
