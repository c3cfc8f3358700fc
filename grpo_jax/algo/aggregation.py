"""Aggregation: how per-token losses ℓ_{i,t} become one scalar — the place where implementations differ.

Each mode returns a pair (sum, denominator) instead of a mean. The batch loss is sum / denominator, and
because both parts are sums over completions, a rollout batch split into mini- or micro-batches gives exactly
the whole-batch loss and gradient when the pieces' sums and denominators are added before dividing:

    loss = (Σ_k sum_k) / (Σ_k denom_k),    ∇loss = (Σ_k ∇sum_k) / (Σ_k denom_k)

(the denominators count tokens or completions and do not depend on the parameters).

With m_{i,t} the completion mask, |o_i| = Σ_t m_{i,t}, and G⁺ the number of completions with |o_i| > 0:

| mode                      | sum                              | denominator  | loss is                       |
|---------------------------|----------------------------------|--------------|-------------------------------|
| `seq_mean_token_mean`     | Σ_i (1/|o_i|) Σ_t m ℓ_{i,t}      | G⁺           | DeepSeekMath Eq. 3; TRL `grpo` |
| `token_mean`              | Σ_{i,t} m ℓ_{i,t}                | Σ_i |o_i|    | DAPO (arXiv:2503.14476); TRL `dapo` |
| `seq_mean_token_sum_norm` | Σ_{i,t} m ℓ_{i,t}                | G⁺ · C_max   | Dr. GRPO (arXiv:2503.20783); TRL `dr_grpo` |

C_max is `max_completion_length`, or the mask's width T when None.

Empty completions (|o_i| = 0, e.g. rows that only pad a batch to a static shape) contribute to neither the
sum nor the denominator, so they are inert; a real completion always has ≥ 1 token (its stop token). TRL
divides `grpo` and `dr_grpo` by the number of rows instead, which differs only when rows are empty. Masked
positions may hold anything, NaN included: they are selected away with `where`, never multiplied by 0.
Divide with `safe_divide`, which returns 0 (not NaN) when everything was empty.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.registry import Registry

# name -> fn(loss_BxT, mask_BxT, max_completion_length) -> (sum, denominator)
AGGREGATIONS = Registry("grpo.aggregation", "aggregation", objects=True)


def _masked(x_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  return jnp.where(mask_BxT.astype(bool), x_BxT.astype(jnp.float32), 0.0)


def _lengths_B(mask_BxT: jax.Array) -> jax.Array:
  return jnp.sum(mask_BxT.astype(bool), axis=-1).astype(jnp.float32)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(loss_BxT, mask_BxT, max_completion_length=None):
  """(Σ_i mean_t ℓ_{i,t}, number of non-empty completions)."""
  del max_completion_length
  lengths_B = _lengths_B(mask_BxT)
  per_seq_B = jnp.sum(_masked(loss_BxT, mask_BxT), axis=-1) / jnp.maximum(lengths_B, 1.0)
  return jnp.sum(per_seq_B), jnp.sum(lengths_B > 0).astype(jnp.float32)


@AGGREGATIONS.register("token_mean")
def token_mean(loss_BxT, mask_BxT, max_completion_length=None):
  """(Σ_{i,t} ℓ_{i,t}, number of real tokens)."""
  del max_completion_length
  return jnp.sum(_masked(loss_BxT, mask_BxT)), jnp.sum(_lengths_B(mask_BxT))


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(loss_BxT, mask_BxT, max_completion_length=None):
  """(Σ_{i,t} ℓ_{i,t}, number of non-empty completions × C_max): a length-independent constant normalizer."""
  C_max = mask_BxT.shape[-1] if max_completion_length is None else max_completion_length
  num_seqs = jnp.sum(_lengths_B(mask_BxT) > 0).astype(jnp.float32)
  return jnp.sum(_masked(loss_BxT, mask_BxT)), num_seqs * float(C_max)


def get_aggregation(name_or_fn: str | Callable) -> Callable:
  """The mode called `name_or_fn`, or a function `fn(loss_BxT, mask_BxT, max_completion_length) -> (sum, denom)`."""
  return AGGREGATIONS.get(name_or_fn)


def aggregate(name_or_fn, loss_BxT, mask_BxT, max_completion_length=None):
  """(sum, denominator) float32 scalars of `loss_BxT` under the named aggregation mode."""
  return get_aggregation(name_or_fn)(loss_BxT, mask_BxT, max_completion_length)


def masked_sum_count(value_BxT: jax.Array, mask_BxT: jax.Array):
  """(Σ of value over real tokens, number of real tokens): a metric that averages exactly over micro-batches."""
  return jnp.sum(_masked(value_BxT, mask_BxT)), jnp.sum(_lengths_B(mask_BxT))


def safe_divide(total, denominator):
  """total / denominator, and 0 where the denominator is 0 (every completion empty: the sum is 0 too)."""
  denominator = jnp.asarray(denominator, jnp.float32)
  return jnp.where(denominator > 0, total / jnp.where(denominator > 0, denominator, 1.0), 0.0)
