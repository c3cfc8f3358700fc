"""The policy a run trains, behind one interface: full fine-tuning, or LoRA adapters on a frozen base.

The loop and the run's programs ask the policy, never "is this LoRA?": which parameters the update optimizes,
where the reference log-probs come from, what a checkpoint holds and how parameters come back from one.
`params` is always the whole model state (base and adapters); a "base" is the state without adapters, the
layout of a full fine-tuning run's parameters and of a saved starting point.
"""
from __future__ import annotations

from flax import nnx

from grpo_jax.model import lora as lora_lib
from grpo_jax.persist import checkpoint as checkpoint_lib
from grpo_jax.train.offload import RefOffloader

class FullPolicy:
  """Every parameter trains. With beta > 0 the reference is a copy of the starting parameters, parked in host
  memory between uses when `model.offload_ref_params` is set."""
  trainable = None  # the nnx filter of what the update optimizes (make_train_step): everything

  def __init__(self, graphdef, initial_params, *, beta: float, offloader: RefOffloader, copy_params):
    self.graphdef = graphdef
    self.base_graphdef = graphdef  # reads base_part(params): the warm start, the reference log-probs
    self.initial_params = initial_params
    self.beta, self.offloader, self.copy_params = beta, offloader, copy_params

  def describe(self) -> str | None:
    """A line for the console about what trains, or None."""
    return None

  def trainable_part(self, params):
    return params

  def base_part(self, params):
    return params

  def frozen_part(self, params):
    """What the update never changes (None: nothing); `joined(trainable_part, frozen_part)` is `params`."""
    return None

  def joined(self, trainable, frozen):
    return trainable

  def from_base(self, base_params):
    """A starting point (base parameters) -> the policy's parameters."""
    return base_params

  def new_reference(self, params):
    """The reference state kept in the run state for a run starting (or reset) at `params`: None with beta 0."""
    return self.offloader.park(self.copy_params(params)) if self.beta > 0 else None

  def reference(self, params, ref_state):
    """The reference parameters for this step's log-probs (read with `base_graphdef`), or None."""
    return self.offloader.fetch(ref_state) if self.beta > 0 else None

  def checkpoint_arrays(self, params, opt_state, ref_state) -> dict:
    tree = {"params": params, "opt_state": opt_state}
    if ref_state is not None:
      tree["ref_params"] = ref_state
    return tree

  def checkpoint_meta(self, params) -> dict:
    return {}

  def from_checkpoint(self, arrays: dict, meta: dict, start: str):
    """(params, ref_state) of a restored checkpoint's arrays; `start`: the run's saved starting point (the orbax
    directory of its warm start), where a LoRA run's frozen base is."""
    return arrays["params"], arrays.get("ref_params")


class LoraPolicy(FullPolicy):
  """Only the adapters train; the base is frozen and is the reference, read without the adapters (no copy).
  Checkpoints hold the adapters and their optimizer state alone, with a fingerprint of the base that a restore
  checks the base it reads back against (`checkpoint.restore_lora_base`)."""
  trainable = nnx.LoRAParam

  def __init__(self, graphdef, initial_params, *, beta: float, offloader: RefOffloader, copy_params,
               lora: lora_lib.LoraConfig):
    super().__init__(graphdef, initial_params, beta=beta, offloader=offloader, copy_params=copy_params)
    self.lora = lora
    self.base_graphdef = lora_lib.base_graphdef(graphdef, initial_params)
    self._initial_adapters = lora_lib.split_adapters(initial_params)[0]
    self._base_fingerprint: str | None = None  # computed once per process: the base never changes

  def describe(self) -> str:
    n_adapters, n_all = lora_lib.count(self.initial_params)
    return (f"[lora] rank {self.lora.rank}, alpha {self.lora.alpha:g} on {', '.join(self.lora.targets)}: "
            f"{n_adapters:,} trainable parameters of {n_all:,} ({100 * n_adapters / n_all:.2f}%)")

  def trainable_part(self, params):
    return lora_lib.split_adapters(params)[0]

  def base_part(self, params):
    return lora_lib.split_adapters(params)[1]

  frozen_part = base_part

  def joined(self, trainable, frozen):
    return lora_lib.join(trainable, frozen)

  def from_base(self, base_params):
    # This run's freshly drawn adapters (B = 0: the policy equals the base) on the given base.
    return lora_lib.join(self._initial_adapters, base_params)

  def new_reference(self, params):
    return None  # the reference is the base inside `params`

  def reference(self, params, ref_state):
    return self.base_part(params) if self.beta > 0 else None

  def checkpoint_arrays(self, params, opt_state, ref_state) -> dict:
    return {"adapters": self.trainable_part(params), "opt_state": opt_state}

  def checkpoint_meta(self, params) -> dict:
    if self._base_fingerprint is None:
      self._base_fingerprint = checkpoint_lib.lora_base_fingerprint(self.base_part(params))
    return {"lora_base_fingerprint": self._base_fingerprint}

  def from_checkpoint(self, arrays: dict, meta: dict, start: str):
    fingerprint = meta.get("lora_base_fingerprint")
    base = checkpoint_lib.restore_lora_base(start, self.base_part(self.initial_params), fingerprint)
    self._base_fingerprint = fingerprint
    return lora_lib.join(arrays["adapters"], base), None


def make_policy(config, graphdef, initial_params, mesh, copy_params) -> FullPolicy:
  """The policy of `config.model` (LoRA when `model.lora_rank` > 0) over the built model; `config`: the run's
  settings (grpo_jax/settings.py), or the ConfigDict they are built from."""
  offloader = RefOffloader(config.model.offload_ref_params, mesh)
  lora = lora_lib.LoraConfig.from_config(config.model)
  kwargs = dict(beta=config.grpo.beta, offloader=offloader, copy_params=copy_params)
  if lora:
    return LoraPolicy(graphdef, initial_params, lora=lora, **kwargs)
  return FullPolicy(graphdef, initial_params, **kwargs)
