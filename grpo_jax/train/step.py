"""The jitted GRPO update: `num_iterations` passes of mini-batch updates over one rollout batch.

One pure function of (params, opt_state, batch), jitted once with params and optimizer state donated:

  for each of mu passes (lax.scan):
    for each mini-batch (lax.scan):                      -> one optimizer update
      for each micro-batch (lax.scan): accumulate grad(loss_sum), denom and metric (sum, count) pairs
      grads = sum grad(loss_sum) / sum denom             -> exactly the mini-batch loss's gradient
      clip + AdamW

`grpo_objective` returns (loss_sum, denom) per piece, so the accumulated gradient equals the one of the
whole mini-batch whatever the micro-batch size. Old log-probs (pi_old) are computed once, before the first
update, only when the update is not exactly on-policy (mu > 1 or several mini-batches); otherwise
pi_old = stop_gradient(pi_theta) inside the objective. Reference log-probs come in with the batch (computed
once per rollout by `make_logprob_fn`), or are None when beta = 0.

Shapes: B rollout batch, P prompt length, C completion length, M mini-batches, U micro-batches per mini-batch,
b micro-batch size (B = M * U * b).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from grpo_jax.algo.objective import LossConfig, LossInputs, grpo_objective
from grpo_jax.model import moe
from grpo_jax.model.logprobs import completion_logprobs, routing_order


class RolloutBatch(NamedTuple):
  """One rollout batch as the update sees it (groups contiguous, G rows per prompt)."""
  prompt_BxP: jax.Array            # int32, left padded
  prompt_mask_BxP: jax.Array       # int32
  completion_BxC: jax.Array        # int32
  completion_mask_BxC: jax.Array   # int32 (0 on padding, and on completions masked out of the loss)
  advantages_B: jax.Array          # float32
  sampler_logp_BxC: jax.Array      # float32, log-probs the sampler reported (for the mismatch metric)
  ref_logp_BxC: jax.Array | None   # float32 reference log-probs, None when beta = 0
  experts_BxTxLxk: jax.Array | None = None  # mixtures of experts: the sampler's experts (SampleResult), else None


def _split(x, *lead):
  """[B, ...] -> [*lead, B / prod(lead), ...] (None passes through)."""
  if x is None:
    return None
  return x.reshape(*lead, -1, *x.shape[1:])


def make_logprob_fn(graphdef: nnx.GraphDef, *, temperature: float, chunk_size: int, micro_batch_size: int,
                    with_entropy: bool = False, prompt_repeats: int = 1, routing_replay: bool = False):
  """A pure fn(params, batch) -> logp_BxC (and entropy_BxC), computed micro-batch by micro-batch.

  Used for the reference policy (jit it separately) and, inside the update, for the old policy.
  `prompt_repeats` (dividing `micro_batch_size`): consecutive rows sharing one prompt, run once
  (`completion_logprobs`). `routing_replay`: a mixture of experts uses the batch's recorded experts.
  """
  _check_repeats(prompt_repeats, micro_batch_size)

  def logprobs(params, batch: RolloutBatch):
    B = batch.completion_BxC.shape[0]
    if B % micro_batch_size:
      raise ValueError(f"batch of {B} rows is not a multiple of micro_batch_size={micro_batch_size}")
    U = B // micro_batch_size
    model = nnx.merge(graphdef, params)

    def one(args):
      p, pm, c, cm, experts = args
      return completion_logprobs(model, p, pm, c, cm, temperature, chunk_size, with_entropy, prompt_repeats,
                                 experts_BxTxLxk=experts)

    pieces = (batch.prompt_BxP, batch.prompt_mask_BxP, batch.completion_BxC, batch.completion_mask_BxC,
              batch.experts_BxTxLxk if routing_replay else None)
    logp, ent = jax.lax.map(one, tuple(_split(x, U) for x in pieces))
    logp = logp.reshape(B, -1)
    return logp if not with_entropy else (logp, ent.reshape(B, -1))

  return logprobs


def _check_repeats(prompt_repeats: int, micro_batch_size: int):
  if prompt_repeats < 1 or micro_batch_size % prompt_repeats:
    raise ValueError(f"prompt_repeats={prompt_repeats} must be >= 1 and divide micro_batch_size={micro_batch_size}")


def check_prompt_runs(batch: RolloutBatch, prompt_repeats: int) -> None:
  """Raises ValueError unless each aligned run of `prompt_repeats` rows holds one prompt (host arrays): the
  shared-prompt forward reads only a run's first prompt, so a batch that breaks the runs must not reach it."""
  if prompt_repeats == 1:
    return
  for name in ("prompt_BxP", "prompt_mask_BxP"):
    x = np.asarray(getattr(batch, name))
    runs = x.reshape(-1, prompt_repeats, *x.shape[1:])
    bad = np.flatnonzero(np.any(runs != runs[:, :1], axis=tuple(range(1, runs.ndim))))
    if bad.size:
      raise ValueError(f"rows {bad[0] * prompt_repeats}..{(bad[0] + 1) * prompt_repeats - 1} of the rollout batch "
                       f"do not share one {name} (model.share_prompt_forward needs each group's rows contiguous)")


def _mismatch(a_BxC, b_BxC, mask_BxC):
  """(max, (sum, count)) of |a - b| over the real tokens."""
  real = mask_BxC > 0
  abs_BxC = jnp.where(real, jnp.abs(a_BxC - b_BxC), 0.0)
  return jnp.max(abs_BxC), (jnp.sum(abs_BxC), jnp.sum(real).astype(jnp.float32))


def keep_if(flag, new, old):
  """`new` where the scalar `flag` holds, else `old` (same pytrees). One lax.cond, not a jnp.where per leaf: on
  SmolLM2 the per-leaf select on a flag reduced from every new parameter made the update take 3.7x longer to
  compile (benchmarks/update_compile_bench.py), for the same values."""
  return jax.lax.cond(flag, lambda: new, lambda: old)


def _routing_flips(routing, micro: RolloutBatch, prompt_repeats: int):
  """(flipped, pairs) over expert layers and the tokens the sampler fed through its model (real prompt tokens, and
  completion tokens but each row's last, which it never feeds): the update's top-k set differs from the sampler's."""
  P = micro.prompt_BxP.shape[1]
  mask_BxC = micro.completion_mask_BxC.astype(bool)
  fed_BxT = jnp.concatenate([micro.prompt_mask_BxP.astype(bool), mask_BxC & jnp.pad(mask_BxC[:, 1:], ((0, 0), (0, 1)))],
                            axis=1)
  fed_N = routing_order(fed_BxT, P, prompt_repeats).astype(jnp.float32)
  sampler_NxLxk = routing_order(micro.experts_BxTxLxk, P, prompt_repeats)
  flips = [jnp.any(jnp.sort(experts, -1) != jnp.sort(sampler_NxLxk[:, i].astype(experts.dtype), -1), -1)
           for i, (_, experts, _) in enumerate(routing)]
  return jnp.sum(jnp.stack(flips, 1) * fed_N[:, None]), jnp.sum(fed_N) * len(routing)


def _moe_terms(routing, cfg, coefs):
  """(metrics as (sum, count) pairs, coef-weighted auxiliary loss) of one micro-batch's expert layers."""
  layers = [i for i in range(cfg.num_layers) if cfg.is_moe(i)]
  loads = [moe.expert_load(experts, cfg.num_experts, valid) for _, experts, valid in routing]
  aux = jnp.mean(jnp.stack([moe.load_balancing_loss(*r) for r in routing]))
  z = jnp.mean(jnp.stack([moe.router_z_loss(logits, valid) for logits, _, valid in routing]))
  one = lambda x: (jax.lax.stop_gradient(x), jnp.float32(1))
  metrics = {"moe/expert_load": one(jnp.max(jnp.stack(loads))), "moe/aux_loss": one(aux), "moe/z_loss": one(z),
             **{f"moe/expert_load/{i}": one(load) for i, load in zip(layers, loads)}}
  return metrics, coefs[0] * aux + coefs[1] * z


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, loss_cfg: LossConfig, *,
                    num_iterations: int, mini_batch_size: int, micro_batch_size: int, temperature: float,
                    chunk_size: int, prompt_repeats: int = 1, trainable: nnx.filterlib.Filter | None = None,
                    moe_loss_coefs: tuple[float, float] = (0.0, 0.0), routing_replay: bool = False):
  """Returns the pure `train_step(params, opt_state, batch) -> (params, opt_state, metrics)`.

  `trainable`: an NNX filter of the parameters that are differentiated and optimized (e.g. `nnx.LoRAParam`);
  the others pass through unchanged. `opt_state` is then the optimizer's state of those parameters alone
  (`optimizer.init(nnx.split_state(params, trainable, ...)[0])`). None: all of them.

  `prompt_repeats`: runs of that many consecutive rows share their prompt (it divides the group size and
  `micro_batch_size`); each prompt's forward then runs once for its run (`completion_logprobs`).

  `metrics` holds scalars: 'loss' (mean over updates), 'grad_norm' (before clipping, mean over updates),
  'skipped_updates' (updates skipped for a non-finite loss, gradient or result),
  'logp_mismatch' and 'logp_mismatch_mean' (max and mean |sampler log-prob - trainer log-prob| over real
  completion tokens, at the parameters that sampled), and each objective metric (e.g. 'kl',
  'clip_ratio/low') averaged exactly over every token/sequence the passes saw. Jit it with `donate_argnums=(0, 1)`.

  A mixture of experts adds 'moe/expert_load' (the largest over layers of max / mean tokens per expert, over real
  tokens), 'moe/expert_load/<layer>', 'moe/aux_loss' and 'moe/z_loss' (grpo_jax/model/moe.py, means over
  layers), averaged over micro-batches; `moe_loss_coefs` = (aux, z) adds coef * loss to each micro-batch's
  objective, weighted by its denominator, so that the update's loss gains coef * their mean. With the sampler's
  experts in the batch, 'moe/routing_flip' is the fraction of (real token, expert layer) pairs whose top-k set
  the update's router chose differently; `routing_replay` makes the update (and the old policy's log-probs) use
  the sampler's experts, the gradient still reaching the router through their weights.
  """
  if mini_batch_size % micro_batch_size:
    raise ValueError(f"micro_batch_size={micro_batch_size} does not divide mini_batch_size={mini_batch_size}")
  _check_repeats(prompt_repeats, micro_batch_size)

  def split_trainable(params):
    """(trainable, frozen or None)."""
    return (params, None) if trainable is None else nnx.split_state(params, trainable, ...)

  def join(trained, frozen):
    return trained if frozen is None else nnx.merge_state(trained, frozen)

  def loss_fn(trained, frozen, micro: RolloutBatch, old_logp_BxC):
    model = nnx.merge(graphdef, join(trained, frozen))
    logp, entropy, routing = completion_logprobs(
        model, micro.prompt_BxP, micro.prompt_mask_BxP, micro.completion_BxC, micro.completion_mask_BxC,
        temperature, chunk_size, with_entropy=True, prompt_repeats=prompt_repeats, with_routing=True,
        experts_BxTxLxk=micro.experts_BxTxLxk if routing_replay else None)
    inputs = LossInputs(logp_BxT=logp, old_logp_BxT=old_logp_BxC, ref_logp_BxT=micro.ref_logp_BxC,
                        advantages_B=micro.advantages_B, mask_BxT=micro.completion_mask_BxC,
                        entropy_BxT=entropy, sampler_logp_BxT=micro.sampler_logp_BxC)
    loss_sum, denom, metrics = grpo_objective(inputs, loss_cfg)
    if routing:
      moe_metrics, moe_loss = _moe_terms(routing, model.cfg, moe_loss_coefs)
      loss_sum, metrics = loss_sum + moe_loss * denom, {**metrics, **moe_metrics}
      if micro.experts_BxTxLxk is not None:
        metrics["moe/routing_flip"] = _routing_flips(routing, micro, prompt_repeats)
    mismatch, mismatch_mean = _mismatch(jax.lax.stop_gradient(logp), micro.sampler_logp_BxC,
                                        micro.completion_mask_BxC)
    return loss_sum, (denom, dict(metrics, logp_mismatch_mean=mismatch_mean), mismatch)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(params, opt_state, batch: RolloutBatch):
    B = batch.completion_BxC.shape[0]
    if B % mini_batch_size:
      raise ValueError(f"rollout batch of {B} is not a multiple of mini_batch_size={mini_batch_size}")
    M = B // mini_batch_size
    U = mini_batch_size // micro_batch_size
    on_policy = num_iterations == 1 and M == 1
    if on_policy:
      old_logp = old_mismatch = None
    else:
      old_fn = make_logprob_fn(graphdef, temperature=temperature, chunk_size=chunk_size,
                               micro_batch_size=micro_batch_size, prompt_repeats=prompt_repeats,
                               routing_replay=routing_replay)
      old_logp = jax.lax.stop_gradient(old_fn(params, batch))
      old_mismatch, old_mismatch_mean = _mismatch(old_logp, batch.sampler_logp_BxC, batch.completion_mask_BxC)
    pieces = jax.tree.map(lambda x: _split(x, M, U), (batch, old_logp))

    # The metric dict's structure, to start the accumulators at zero.
    first_micro = jax.tree.map(lambda x: x[0, 0], pieces)
    trained, frozen = split_trainable(params)
    _, (_, metric_shapes, _) = jax.eval_shape(loss_fn, trained, frozen, *first_micro)
    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), metric_shapes)

    def update(carry, mini):
      trained, opt_state, metrics_total = carry  # trained: the trainable parameters

      def accumulate(acc, micro_and_old):
        grads, loss_sum, denom, metrics, mismatch = acc
        (l, (d, m, mm)), g = grad_fn(trained, frozen, *micro_and_old)
        grads = jax.tree.map(jnp.add, grads, g)
        metrics = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), metrics, m)
        return (grads, loss_sum + l, denom + d, metrics, jnp.maximum(mismatch, mm)), None

      zeros = jax.tree.map(jnp.zeros_like, trained)
      init = (zeros, jnp.float32(0), jnp.float32(0), zero_metrics, jnp.float32(0))
      (grads, loss_sum, denom, metrics, mismatch), _ = jax.lax.scan(accumulate, init, mini)
      denom = jnp.maximum(denom, 1e-8)  # an all-masked mini-batch contributes a zero gradient, not NaN.
      grads = jax.tree.map(lambda g: g / denom, grads)
      grad_norm = optax.tree.norm(grads)
      updates, new_opt_state = optimizer.update(grads, opt_state, trained)
      new_trained = optax.apply_updates(trained, updates)
      # A non-finite loss, gradient or result skips the update: parameters and optimizer state stay as they
      # were (the loop counts it and stops after several in a row), so no NaN ever reaches a checkpoint.
      finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm) & jnp.all(
          jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(new_trained)]))
      trained, opt_state = keep_if(finite, (new_trained, new_opt_state), (trained, opt_state))
      metrics_total = jax.tree.map(jnp.add, metrics_total, metrics)
      return (trained, opt_state, metrics_total), (loss_sum / denom, grad_norm, mismatch, ~finite)

    (trained, opt_state, metric_sums), (loss, grad_norm, mismatch, skipped) = jax.lax.scan(
        lambda carry, _: jax.lax.scan(update, carry, pieces), (trained, opt_state, zero_metrics), None,
        length=num_iterations)
    params = join(trained, frozen)
    out = {"loss": jnp.mean(loss), "grad_norm": jnp.mean(grad_norm),
           "skipped_updates": jnp.sum(skipped).astype(jnp.float32),
           # Only the first update differentiates at the sampling parameters.
           "logp_mismatch": mismatch[0, 0] if on_policy else old_mismatch}
    if not on_policy:  # measured at the sampling parameters, not averaged over the later updates
      metric_sums = dict(metric_sums, logp_mismatch_mean=old_mismatch_mean)
    for name, (total, count) in metric_sums.items():
      out[name] = total / jnp.maximum(count, 1.0)
    return params, opt_state, out

  return train_step
