"""A registry of named policy losses, so a loss can be chosen by name in a config or passed as a function.

A policy loss is a pure function

    fn(inputs: LossInputs, cfg: LossConfig) -> (per_token_loss_BxT, metrics)

- `inputs` (`grpo_jax.algo.objective.LossInputs`) arrives already cleaned by `grpo_objective`:
  `old_logp_BxT` is filled in (stop_gradient(logp_BxT) when the caller passed None), and every masked
  position of `logp_BxT`, `old_logp_BxT`, `ref_logp_BxT` and `entropy_BxT` holds 0.0 (never NaN/inf), so
  `exp(logp - old_logp)` is 1 there. `mask_BxT` is bool. `advantages_B` is float32 [B].
- `cfg` is the frozen `LossConfig`; a loss reads the fields it needs (e.g. `epsilon_low`).
- `per_token_loss_BxT` is the POLICY term only, as a loss to MINIMIZE (minus the surrogate objective),
  float32 [B, T]. Values at masked positions are ignored. The objective adds β·KL and −entropy_coef·H,
  applies top-entropy token selection, and aggregates (`aggregation.py`); a policy loss does none of that.
- `metrics` is a dict name -> (sum, count) of float32 scalars, so that metrics of micro-batches add up
  exactly; `aggregation.masked_sum_count(value_BxT, mask_BxT)` makes the pair for a per-token mean.

A user's own loss (say, written in a notebook) plugs in without touching the package, either by object,
`LossConfig(policy_loss=my_loss)`, or by name after `register_loss("my_loss")(my_loss)`.
"""
from __future__ import annotations

from typing import Callable

from grpo_jax.registry import Registry

LOSSES = Registry("grpo.policy_loss", "policy loss", builtins="grpo_jax.algo.policy_losses", objects=True)


def register_loss(name: str, *, overwrite: bool = False):
  """Decorator that registers `fn` under `name` and returns it unchanged (`Registry.register`'s rules)."""
  return LOSSES.register(name, overwrite=overwrite)


def get_loss(name_or_fn: str | Callable) -> Callable:
  """The registered loss called `name_or_fn`, or `name_or_fn` itself when it is already a function."""
  return LOSSES.get(name_or_fn)


def list_losses() -> list[str]:
  """Sorted names of all registered policy losses."""
  return LOSSES.names()
