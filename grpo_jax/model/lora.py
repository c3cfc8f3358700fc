"""Low-rank adapters (LoRA; Hu et al. 2021, arXiv:2106.09685) on the transformer's projections.

Each targeted projection W (D_in -> D_out) computes W x + (alpha / r) B (A x), with A [D_in, r] and B [r, D_out]
the `lora_a` / `lora_b` of a flax NNX `nnx.LoRA` module (A drawn He-uniform, B zero, so an adapted model starts
exactly at its base). The adapters are `nnx.LoRAParam`s, a subclass of `nnx.Param`: the update differentiates
and optimizes only them (`grpo_jax/train/step.py`, `trainable=nnx.LoRAParam`), the base weights stay frozen, and
the base model is the adapted model's state without its adapters, read by a graphdef without them
(`base_graphdef`): the reference policy with adapters off costs no second copy of the weights.

Targets use Hugging Face's projection names (those `peft`'s `target_modules` take): q_proj, k_proj, v_proj,
o_proj, gate_proj, up_proj, down_proj, and in Qwen3.5's linear-attention layers in_proj_qkv, in_proj_z, out_proj;
in a mixture-of-experts layer the MLP's three adapt every expert (one low-rank update per expert,
`ExpertAdapters`), and Gemma 4's expert block beside the MLP gets its own; the router, Qwen3.5's output gate and
its small beta / decay projections are not adapted. Adapters are replicated over the mesh (they are small).

Each adapter takes its sizes from the weight it adapts, so a layer with its own geometry gets adapters of that
geometry (Gemma 4's global layers: their own head_dim and kv heads; its double-wide MLPs), and a target whose
weight a block lacks gets none (Gemma 4's layers that read another's keys and values have no k_proj / v_proj,
an `attention_k_eq_v` global layer no v_proj: its values are its keys, adapter included).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.config_checks import Section
from grpo_jax.model import linear_attention
from grpo_jax.model.config import ModelConfig

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
LINEAR_TARGETS = ("in_proj_qkv", "in_proj_z", "out_proj")  # linear_attention.GatedDeltaNet
TARGETS = ATTENTION_TARGETS + MLP_TARGETS + LINEAR_TARGETS
# Target -> the weight it adapts (transformer.py's names), whose shape the [D_in, D_out] update is reshaped to.
WEIGHT_OF = {"q_proj": "q_DxNxH", "k_proj": "k_DxKxH", "v_proj": "v_DxKxH", "o_proj": "o_NxHxD",
             "gate_proj": "gate_DxF", "up_proj": "up_DxF", "down_proj": "down_FxD",
             "in_proj_qkv": "qkv_DxC", "in_proj_z": "z_DxHvxDv", "out_proj": "out_HvxDvxD"}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  rank: int
  alpha: float
  targets: tuple[str, ...] = TARGETS

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
    if not self.alpha > 0:
      raise ValueError(f"LoRA alpha must be > 0, got {self.alpha}")
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown or not self.targets:
      raise ValueError(f"LoRA targets {list(self.targets)}: expected a non-empty subset of {list(TARGETS)}")

  @classmethod
  def from_config(cls, model) -> "LoraConfig | None":
    """The `model` section's lora_rank / lora_alpha / lora_targets (grpo_jax/settings.py's ModelSettings, or the
    ConfigDict it is built from); None when lora_rank is 0 (full fine-tuning)."""
    rank = int(getattr(model, "lora_rank", 0))
    if rank == 0:
      return None
    return cls(rank, float(model.lora_alpha), parse_targets(model.lora_targets))

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def parse_targets(spec: str) -> tuple[str, ...]:
  """"all" or comma-separated projection names -> the names in `TARGETS` order (ValueError on unknown ones)."""
  if spec.strip() == "all":
    return TARGETS
  names = {s.strip() for s in spec.split(",") if s.strip()}
  unknown = sorted(names - set(TARGETS))
  if unknown or not names:
    raise ValueError(f"{spec!r}: unknown projection(s) {unknown}; expected 'all' or a comma-separated subset of "
                     f"{', '.join(TARGETS)}")
  return tuple(t for t in TARGETS if t in names)


def validate_config(model) -> None:
  """Checks the LoRA keys of `config.model` (lora_rank, lora_alpha, lora_targets) and what LoRA excludes within
  the section; raises ConfigError naming key and value."""
  s = Section(model, "model")
  if s["lora_rank"] == 0:
    return
  s.positive("lora_alpha")
  try:
    parse_targets(s["lora_targets"])
  except ValueError as e:
    s.fail("lora_targets", str(e))
  if s["offload_ref_params"]:
    s.fail("offload_ref_params", "with LoRA (model.lora_rank > 0) the reference is the base model itself, there "
           "is no reference copy to offload")


# A mixture-of-experts block's targets -> its [E, D_in, D_out] weights (grpo_jax/model/moe.py).
EXPERT_WEIGHT_OF = {"gate_proj": "gate_ExDxF", "up_proj": "up_ExDxF", "down_proj": "down_ExFxD"}


def layer_projection_sizes(cfg: ModelConfig, layer: int) -> list[tuple[dict[str, tuple[int, int]], bool]]:
  """(target -> (D_in, D_out), whether it is an expert block) for each block of layer `layer` that `_blocks`
  yields, from the config alone (what `add_adapters` reads from the weights): the mixer with the layer's own head
  geometry and only the projections it has, the MLP with the layer's width, then Gemma 4's expert block."""
  D, NH = cfg.hidden_size, cfg.num_heads * cfg.layer_head_dim(layer)
  KH = cfg.layer_kv_heads(layer) * cfg.layer_head_dim(layer)
  if cfg.is_linear(layer):
    values = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    mixer = {"in_proj_qkv": (D, linear_attention.channels(cfg)), "in_proj_z": (D, values), "out_proj": (values, D)}
  else:
    mixer = {"q_proj": (D, NH), "k_proj": (D, KH), "v_proj": (D, KH), "o_proj": (NH, D)}
    if cfg.kv_source(layer) is not None:
      del mixer["k_proj"], mixer["v_proj"]
    elif cfg.values_from_keys(layer):
      del mixer["v_proj"]
  mlp = lambda F: {"gate_proj": (D, F), "up_proj": (D, F), "down_proj": (F, D)}  # noqa: E731
  dense, experts = mlp(cfg.layer_intermediate_size(layer)), mlp(cfg.moe_intermediate_size)  # one expert's
  if not cfg.is_moe(layer):
    return [(mixer, False), (dense, False)]
  if cfg.gemma4:  # the expert block beside the MLP
    return [(mixer, False), (dense, False), (experts, True)]
  return [(mixer, False), (experts, True)]


# Leading axes of a target's weight that are its input (after an expert weight's E): the rest are its output.
INPUT_AXES = {"o_proj": 2, "out_proj": 2}


def block_sizes(block, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
  """Target -> (D_in, D_out) of the matrix it applies in `block` (one expert's in an expert block), read from the
  block's own weights; a target whose weight the block lacks is left out."""
  experts = _is_experts(block)
  sizes = {}
  for name in names:
    weight = getattr(block, (EXPERT_WEIGHT_OF if experts else WEIGHT_OF)[name], None)
    if weight is None:
      continue
    shape = weight.shape[1:] if experts else weight.shape
    k = INPUT_AXES.get(name, 1)
    sizes[name] = (math.prod(shape[:k]), math.prod(shape[k:]))
  return sizes


class ExpertAdapters(nnx.Module):
  """The adapters of a mixture-of-experts block: one low-rank update per expert and targeted projection, A
  [E, D_in, r] (He-uniform, as nnx.LoRA draws it) and B [E, r, D_out] (zero) as `<name>_a` / `<name>_b`."""

  def __init__(self, sizes: dict[str, tuple[int, int]], lora: LoraConfig, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.names = tuple(name for name in sizes if name in lora.targets)
    self.scale = lora.scale
    E, r, pd = cfg.num_experts, lora.rank, cfg.jnp_param_dtype
    init = jax.nn.initializers.he_uniform(in_axis=-2, out_axis=-1, batch_axis=0)
    for name in self.names:
      d_in, d_out = sizes[name]
      setattr(self, f"{name}_a", nnx.LoRAParam(init(rngs.params(), (E, d_in, r), pd)))
      setattr(self, f"{name}_b", nnx.LoRAParam(jnp.zeros((E, r, d_out), pd)))

  def _ab(self, name, dtype):
    return getattr(self, f"{name}_a")[...].astype(dtype), getattr(self, f"{name}_b")[...].astype(dtype)

  def add(self, name: str, x, y, matmul):
    """y plus the update of `name` for rows grouped by expert; `matmul(x, w_ExIxO)` applies each row's expert's
    matrix (moe.grouped_experts)."""
    if name not in self.names:
      return y
    a, b = self._ab(name, x.dtype)
    return y + self.scale * matmul(matmul(x, a), b)

  def add_dense(self, name: str, x, y_TxExO):
    """y plus every expert's update of `name`; x is [T, I] (the same input for every expert) or [T, E, I]."""
    if name not in self.names:
      return y_TxExO
    a, b = self._ab(name, x.dtype)
    xa = jnp.einsum("ti,eir->ter", x, a) if x.ndim == 2 else jnp.einsum("tei,eir->ter", x, a)
    return y_TxExO + self.scale * jnp.einsum("ter,ero->teo", xa, b)

  def delta(self, name: str) -> jax.Array:
    """The float32 [E, D_in, D_out] update that merging adds to the weights of `name`."""
    a, b = self._ab(name, jnp.float32)
    return self.scale * (a @ b)


class LayerAdapters(nnx.Module):
  """The adapters of one attention or MLP block: an `nnx.LoRA` per targeted projection, as an attribute of
  that projection's name."""

  def __init__(self, sizes: dict[str, tuple[int, int]], lora: LoraConfig, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.names = tuple(name for name in sizes if name in lora.targets)
    self.scale = lora.scale
    for name in self.names:
      d_in, d_out = sizes[name]
      setattr(self, name, nnx.LoRA(d_in, lora.rank, d_out, dtype=cfg.jnp_dtype, param_dtype=cfg.jnp_param_dtype,
                                   rngs=rngs))

  def add(self, name: str, x_BxTxI, y):
    """y (the base projection of x, any shape with y.size = B T D_out) plus the scaled update of `name`, or y
    unchanged when `name` has no adapter."""
    if name not in self.names:
      return y
    return y + (self.scale * getattr(self, name)(x_BxTxI)).reshape(y.shape).astype(y.dtype)

  def delta(self, name: str) -> jax.Array:
    """The float32 [D_in, D_out] update (alpha / r) A B that merging adds to the weight of `name`."""
    lora = getattr(self, name)
    return self.scale * (lora.lora_a[...].astype(jnp.float32) @ lora.lora_b[...].astype(jnp.float32))


def _blocks(model):
  """(block, the targets it can hold) for the attention (or linear attention) and MLP block of every layer, and
  Gemma 4's expert block beside its MLP."""
  for layer in model.layers:
    yield layer.attn, LINEAR_TARGETS if isinstance(layer.attn, linear_attention.GatedDeltaNet) else ATTENTION_TARGETS
    yield layer.mlp, MLP_TARGETS
    if hasattr(layer, "experts"):
      yield layer.experts, MLP_TARGETS


def add_adapters(model, lora: LoraConfig, rngs: nnx.Rngs):
  """Attaches adapters to `model` (a Transformer, in place) and returns it, each of its weight's sizes
  (`block_sizes`); a block with no targeted projection gets none. Their random draws come from `rngs` alone, so the
  base weights are those of the same model built without LoRA."""
  for block, names in _blocks(model):
    sizes = block_sizes(block, names)
    if any(name in lora.targets for name in sizes):
      block.adapters = (ExpertAdapters if _is_experts(block) else LayerAdapters)(sizes, lora, model.cfg, rngs=rngs)
  return model


def _is_experts(block) -> bool:
  return hasattr(block, "router_DxE")


def add_configured_adapters(model, model_config, key: jax.Array):
  """`model` with the adapters `config.model` asks for (`LoraConfig.from_config`), drawn from `key`; unchanged
  without LoRA."""
  lora = LoraConfig.from_config(model_config)
  return model if lora is None else add_adapters(model, lora, nnx.Rngs(params=key))


def split_adapters(params: nnx.State) -> tuple[nnx.State, nnx.State]:
  """(adapter parameters, base parameters) of an adapted model's state."""
  return nnx.split_state(params, nnx.LoRAParam, ...)


def join(adapters: nnx.State, base: nnx.State) -> nnx.State:
  return nnx.merge_state(adapters, base)


def has_adapters(model) -> bool:
  """Whether a Transformer carries adapters."""
  return any(block.adapters is not None for block, _ in _blocks(model))


def base_graphdef(graphdef: nnx.GraphDef, params: nnx.State) -> nnx.GraphDef:
  """The graphdef of the model without its adapters, which reads `split_adapters(params)[1]`."""
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  model = nnx.merge(graphdef, abstract)
  for block, _ in _blocks(model):
    block.adapters = None
  return nnx.graphdef(model)


def merged(model):
  """`model` (not changed) as a plain Transformer: each adapter's update added to its weight in float32, then
  cast to the weight's dtype, and the adapters removed. The result computes what the adapted model computes (up
  to that rounding) at the cost of the base model: the form `save_pretrained` writes."""
  copy = nnx.clone(model)  # new Variables: assigning to them leaves `model`'s alone
  for block, _ in _blocks(copy):
    adapters = block.adapters
    if adapters is None:
      continue
    for name in adapters.names:
      weight = getattr(block, (EXPERT_WEIGHT_OF if _is_experts(block) else WEIGHT_OF)[name])
      update = adapters.delta(name).reshape(weight.shape)
      weight[...] = (weight[...].astype(jnp.float32) + update).astype(weight.dtype)
    block.adapters = None
  return copy


def count(params) -> tuple[int, int]:
  """(adapter parameters, all parameters) of an adapted model's state, in elements."""
  adapters, _ = split_adapters(params)
  size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  return size(adapters), size(params)
