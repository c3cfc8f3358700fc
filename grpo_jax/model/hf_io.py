"""Hugging Face checkpoints in and out: config.json + safetensors <-> `Transformer`.

Families: llama, qwen2, qwen3, gemma3_text, qwen3_moe, gpt_oss, qwen3_5_text, qwen3_5_moe_text, gemma4_text (and
the language models of the multimodal gemma3, qwen3_5, qwen3_5_moe and gemma4).

Tensor layout. HF `nn.Linear` weights are stored [out, in]; ours are [in, out] with heads split out:
  q_proj.weight [N*H, D]  <->  q_DxNxH        o_proj.weight [D, N*H]   <->  o_NxHxD
  k/v_proj      [K*H, D]  <->  k/v_DxKxH      q/k/v_proj.bias [N*H]    <->  q/k/v_bias_NxH / _KxH
  gate/up_proj  [F, D]    <->  gate/up_DxF    down_proj.weight [D, F]  <->  down_FxD
  lm_head.weight [V, D]   <->  lm_head_DxV    embed_tokens, norms: same layout.

Gemma 3 adds pre_feedforward_layernorm / post_feedforward_layernorm (pre_mlp_norm / post_mlp_norm here); its
post_attention_layernorm normalizes the attention output. A multimodal Gemma 3 checkpoint
(Gemma3ForConditionalGeneration: 4B, 12B, 27B) loads its language model only (tensors under
`language_model.model.` or `model.language_model.`); the vision tower and projector are skipped, and saving
writes a text-only Gemma3ForCausalLM. The same holds for Qwen3.5 (every published one is multimodal); its
multi-token-prediction head (`mtp.*`), which transformers does not load either, is skipped. Gemma 4 adds its
per-layer input tensors, each layer's `layer_scalar` and, with its expert block, `router.*`, `experts.*` and three
norms directly under the layer; a layer that shares another's keys and values has no
k_proj / v_proj / k_norm, and those tensors, if a checkpoint carries them, are ignored as transformers ignores them.

`from_pretrained` builds the model abstractly (`nnx.eval_shape`, no memory), then reads one tensor at a time
and places it directly on its target sharding: each device receives only its own slice.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from grpo_jax.model import sharding as sharding_lib
from grpo_jax.model.config import MULTIMODAL, ModelConfig, from_hf_config, to_hf_config
from grpo_jax.model.transformer import Transformer

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Files of a checkpoint directory that describe tokenization and generation, copied by save_pretrained(source=).
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
               "generation_config.json")
# Non-persistent buffers that some older checkpoints contain; they are recomputed from the config.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
# Where a multimodal checkpoint keeps its language model's decoder (Hub checkpoints; transformers 5's layout).
_LANGUAGE_MODEL_PREFIXES = ("language_model.model.", "model.language_model.")
log = logging.getLogger(__name__)

# Our parameter path (inside one layer, or at the top) -> (HF name, layout kind).
#   copy: same shape. in: ours [D, *out], HF [prod(out), D]. out: ours [*in, D], HF [D, prod(in)].
#   bias: ours [N, H], HF [N*H].
_TOP = {
    ("embed_VxD",): ("model.embed_tokens.weight", "copy"),
    ("final_norm", "scale"): ("model.norm.weight", "copy"),
    ("lm_head_DxV",): ("lm_head.weight", "in"),
    # Gemma 4's per-layer inputs
    ("ple_embed_VxLP",): ("model.embed_tokens_per_layer.weight", "copy"),
    ("ple_model_proj_DxLP",): ("model.per_layer_model_projection.weight", "in"),
    ("ple_proj_norm", "scale"): ("model.per_layer_projection_norm.weight", "copy"),
}
_LAYER = {
    ("input_norm", "scale"): ("input_layernorm.weight", "copy"),
    ("post_attn_norm", "scale"): ("post_attention_layernorm.weight", "copy"),
    ("pre_mlp_norm", "scale"): ("pre_feedforward_layernorm.weight", "copy"),
    ("post_mlp_norm", "scale"): ("post_feedforward_layernorm.weight", "copy"),
    ("attn", "q_DxNxH"): ("self_attn.q_proj.weight", "in"),
    ("attn", "k_DxKxH"): ("self_attn.k_proj.weight", "in"),
    ("attn", "v_DxKxH"): ("self_attn.v_proj.weight", "in"),
    ("attn", "o_NxHxD"): ("self_attn.o_proj.weight", "out"),
    ("attn", "q_bias_NxH"): ("self_attn.q_proj.bias", "bias"),
    ("attn", "k_bias_KxH"): ("self_attn.k_proj.bias", "bias"),
    ("attn", "v_bias_KxH"): ("self_attn.v_proj.bias", "bias"),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", "copy"),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", "copy"),
    ("mlp", "gate_DxF"): ("mlp.gate_proj.weight", "in"),
    ("mlp", "up_DxF"): ("mlp.up_proj.weight", "in"),
    ("mlp", "down_FxD"): ("mlp.down_proj.weight", "out"),
}


# What a family names differently or adds, by family. More layout kinds:
#   experts_in / experts_out: ours [E, ...] stacked from E tensors named with {e}, each `in` / `out` as above
#     (Qwen3-MoE's per-expert gate/up [F, D] -> ours [E, D, F]; down [D, F] -> ours [E, F, D]).
#   even / odd: ours [..., F] are the even / odd columns of one HF tensor [..., 2F] (gpt-oss's gate_up_proj
#     [E, D, 2F] and its bias interleave gate and up).
#   head_q / head_gate: ours [D, N, H] are the first / second H rows of each head's 2H in one HF [N*2H, D]
#     (Qwen3.5's q_proj gives each head's query, then its output gate).
#   conv: ours [K, C], HF [C, 1, K] (a depthwise Conv1d's weight).
#   rows_first / rows_second: ours [E, D, F] are the first / second F rows of each expert's [2F, D] in one HF
#     [E, 2F, D], transposed (Gemma 4's experts.gate_up_proj: gate rows, then up rows).
#   swap: ours [E, F, D], HF [E, D, F] (Gemma 4's experts.down_proj, each expert's [out, in]).
_FAMILY_LAYER = {
    "qwen3_moe": {
        ("mlp", "router_DxE"): ("mlp.gate.weight", "in"),
        ("mlp", "gate_ExDxF"): ("mlp.experts.{e}.gate_proj.weight", "experts_in"),
        ("mlp", "up_ExDxF"): ("mlp.experts.{e}.up_proj.weight", "experts_in"),
        ("mlp", "down_ExFxD"): ("mlp.experts.{e}.down_proj.weight", "experts_out"),
    },
    "gpt_oss": {
        ("attn", "o_bias_D"): ("self_attn.o_proj.bias", "copy"),
        ("attn", "sinks_N"): ("self_attn.sinks", "copy"),
        ("mlp", "router_DxE"): ("mlp.router.weight", "in"),
        ("mlp", "router_bias_E"): ("mlp.router.bias", "copy"),
        ("mlp", "gate_ExDxF"): ("mlp.experts.gate_up_proj", "even"),
        ("mlp", "up_ExDxF"): ("mlp.experts.gate_up_proj", "odd"),
        ("mlp", "down_ExFxD"): ("mlp.experts.down_proj", "copy"),
        ("mlp", "gate_bias_ExF"): ("mlp.experts.gate_up_proj_bias", "even"),
        ("mlp", "up_bias_ExF"): ("mlp.experts.gate_up_proj_bias", "odd"),
        ("mlp", "down_bias_ExD"): ("mlp.experts.down_proj_bias", "copy"),
    },
    "qwen3_5_text": {
        ("attn", "q_DxNxH"): ("self_attn.q_proj.weight", "head_q"),
        ("attn", "gate_DxNxH"): ("self_attn.q_proj.weight", "head_gate"),
        ("attn", "qkv_DxC"): ("linear_attn.in_proj_qkv.weight", "in"),
        ("attn", "z_DxHvxDv"): ("linear_attn.in_proj_z.weight", "in"),
        ("attn", "b_DxHv"): ("linear_attn.in_proj_b.weight", "in"),
        ("attn", "a_DxHv"): ("linear_attn.in_proj_a.weight", "in"),
        ("attn", "conv_KxC"): ("linear_attn.conv1d.weight", "conv"),
        ("attn", "A_log_Hv"): ("linear_attn.A_log", "copy"),
        ("attn", "dt_bias_Hv"): ("linear_attn.dt_bias", "copy"),
        ("attn", "norm_Dv"): ("linear_attn.norm.weight", "copy"),
        ("attn", "out_HvxDvxD"): ("linear_attn.out_proj.weight", "out"),
    },
    "gemma4_text": {
        ("ple_gate_DxP",): ("per_layer_input_gate.weight", "in"),
        ("ple_proj_PxD",): ("per_layer_projection.weight", "out"),
        ("ple_norm", "scale"): ("post_per_layer_input_norm.weight", "copy"),
        ("layer_scalar",): ("layer_scalar", "copy"),
        ("experts", "router_DxE"): ("router.proj.weight", "in"),
        ("experts", "router_scale_D"): ("router.scale", "copy"),
        ("experts", "expert_scale_E"): ("router.per_expert_scale", "copy"),
        ("experts", "gate_ExDxF"): ("experts.gate_up_proj", "rows_first"),
        ("experts", "up_ExDxF"): ("experts.gate_up_proj", "rows_second"),
        ("experts", "down_ExFxD"): ("experts.down_proj", "swap"),
        ("post_mlp_norm_1", "scale"): ("post_feedforward_layernorm_1.weight", "copy"),
        ("pre_experts_norm", "scale"): ("pre_feedforward_layernorm_2.weight", "copy"),
        ("post_experts_norm", "scale"): ("post_feedforward_layernorm_2.weight", "copy"),
    },
}
# Qwen3.5-MoE: Qwen3.5's layers, Qwen3-MoE's experts (one tensor per expert on disk) and a gated shared expert.
_FAMILY_LAYER["qwen3_5_moe_text"] = {
    **_FAMILY_LAYER["qwen3_5_text"], **_FAMILY_LAYER["qwen3_moe"],
    ("mlp", "shared_gate_DxS"): ("mlp.shared_expert.gate_proj.weight", "in"),
    ("mlp", "shared_up_DxS"): ("mlp.shared_expert.up_proj.weight", "in"),
    ("mlp", "shared_down_SxD"): ("mlp.shared_expert.down_proj.weight", "out"),
    ("mlp", "shared_expert_gate_Dx1"): ("mlp.shared_expert_gate.weight", "in"),
}
_HEAD_HALVES = ("head_q", "head_gate")
_ROW_HALVES = ("rows_first", "rows_second")
_PER_EXPERT = {"experts_in": "in", "experts_out": "out"}


def hf_name(path: tuple, family: str = "llama") -> tuple[str, str]:
  """(HF tensor name, layout kind) of our parameter at `path` (as in `nnx.to_flat_state`); a per-expert kind's
  name holds "{e}" for the expert's index."""
  if path and path[0] == "layers":
    inner = tuple(path[2:])
    name, kind = _FAMILY_LAYER.get(family, {}).get(inner) or _LAYER[inner]
    return f"model.layers.{path[1]}.{name}", kind
  return _TOP[tuple(path)]


def _hf_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  """The HF tensor's shape (one expert's for the per-expert kinds)."""
  if kind == "copy":
    return shape
  if kind in _PER_EXPERT:
    return _hf_shape(shape[1:], _PER_EXPERT[kind])
  if kind in ("even", "odd"):
    return (*shape[:-1], 2 * shape[-1])
  if kind in _HEAD_HALVES:
    return (2 * math.prod(shape[1:]), shape[0])
  if kind in _ROW_HALVES:
    return (shape[0], 2 * shape[2], shape[1])
  if kind == "swap":
    return (*shape[:-2], shape[-1], shape[-2])
  if kind == "conv":
    return (shape[1], 1, shape[0])
  if kind == "in":
    return (math.prod(shape[1:]), shape[0])
  if kind == "out":
    return (shape[-1], math.prod(shape[:-1]))
  return (math.prod(shape),)


def _hf_names(name: str, kind: str, shape: tuple[int, ...]) -> list[str]:
  return [name.format(e=e) for e in range(shape[0])] if kind in _PER_EXPERT else [name]


def _to_ours(x: np.ndarray, shape: tuple[int, ...], kind: str) -> np.ndarray:
  """HF array -> our layout (a view where possible: reshape the contiguous array first, then transpose)."""
  if kind == "in":  # [prod(out), D] -> [*out, D] -> [D, *out]
    return np.moveaxis(x.reshape(*shape[1:], shape[0]), -1, 0)
  if kind == "out":  # [D, prod(in)] -> [D, *in] -> [*in, D]
    return np.moveaxis(x.reshape(shape[-1], *shape[:-1]), 0, -1)
  return x.reshape(shape)


def _to_hf(y: np.ndarray, kind: str) -> np.ndarray:
  if kind == "in":
    return np.ascontiguousarray(y.reshape(y.shape[0], -1).T)
  if kind == "out":
    return np.ascontiguousarray(y.reshape(-1, y.shape[-1]).T)
  return np.ascontiguousarray(y.reshape(_hf_shape(y.shape, kind)))


def _read_ours(ckpt, name: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
  if kind in _PER_EXPERT:
    return np.stack([_to_ours(ckpt.read(one), shape[1:], _PER_EXPERT[kind]) for one in _hf_names(name, kind, shape)])
  if kind in ("even", "odd"):
    return ckpt.read(name)[..., kind == "odd"::2]
  if kind in _HEAD_HALVES:  # [N*2H, D] -> [N, 2, H, D] -> this half [N, H, D] -> [D, N, H]
    return np.moveaxis(ckpt.read(name).reshape(shape[1], 2, shape[2], shape[0])[:, _HEAD_HALVES.index(kind)], -1, 0)
  if kind == "conv":
    return ckpt.read(name)[:, 0, :].T
  if kind in _ROW_HALVES:  # [E, 2F, D] -> this half [E, F, D] -> [E, D, F]
    F = shape[2]
    return np.swapaxes(ckpt.read(name)[:, _ROW_HALVES.index(kind) * F:][:, :F], 1, 2)
  if kind == "swap":
    return np.swapaxes(ckpt.read(name), -1, -2)
  return _to_ours(ckpt.read(name), shape, kind)


def _hf_tensors(name: str, members: list[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """The HF tensors of our parameters `members` [(kind, array)] that share the HF `name`."""
  (kind, y), *rest = members
  if kind in _PER_EXPERT:
    return {name.format(e=e): _to_hf(y[e], _PER_EXPERT[kind]) for e in range(y.shape[0])}
  if kind in ("even", "odd"):
    halves = dict(members)
    out = np.empty((*y.shape[:-1], 2 * y.shape[-1]), y.dtype)
    out[..., 0::2], out[..., 1::2] = halves["even"], halves["odd"]
    return {name: out}
  if kind in _HEAD_HALVES:
    halves = dict(members)
    both_Nx2xHxD = np.stack([np.moveaxis(halves[k], 0, -1) for k in _HEAD_HALVES], axis=1)
    return {name: np.ascontiguousarray(both_Nx2xHxD.reshape(-1, y.shape[0]))}
  if kind == "conv":
    return {name: np.ascontiguousarray(y.T[:, None, :])}
  if kind in _ROW_HALVES:
    halves = dict(members)
    return {name: np.ascontiguousarray(np.concatenate([np.swapaxes(halves[k], 1, 2) for k in _ROW_HALVES], 1))}
  if kind == "swap":
    return {name: np.ascontiguousarray(np.swapaxes(y, -1, -2))}
  return {name: _to_hf(y, kind)}


class _Checkpoint:
  """Lazy reader over a single safetensors file or an index of shards."""

  def __init__(self, path: Path):
    index = path / INDEX_FILE
    if index.exists():
      weight_map = json.loads(index.read_text())["weight_map"]
      files = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE).exists():
      files, weight_map = [SINGLE_FILE], None
    else:
      raise FileNotFoundError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    for f in files:
      if not (path / f).exists():
        raise FileNotFoundError(f"{path / f}: shard named in {INDEX_FILE} does not exist")
    self._handles = {f: safe_open(str(path / f), framework="numpy") for f in files}
    if weight_map is None:
      weight_map = {name: SINGLE_FILE for name in self._handles[SINGLE_FILE].keys()}
    self.file_of = weight_map
    self.stored = {}  # our name -> the checkpoint's, where they differ (language_model_only)

  def language_model_only(self, path: Path):
    """Renames a multimodal checkpoint's language-model tensors to a causal LM's names and drops the rest."""
    names = list(self.file_of)
    prefix = next((p for p in _LANGUAGE_MODEL_PREFIXES if any(n.startswith(p) for n in names)), None)
    if prefix is None:
      raise ValueError(f"{path}: a multimodal checkpoint without tensors under any of {_LANGUAGE_MODEL_PREFIXES}")
    heads = ("lm_head.weight", "language_model.lm_head.weight")
    self.stored = {("model." + n[len(prefix):] if n.startswith(prefix) else "lm_head.weight"): n
                   for n in names if n.startswith(prefix) or n in heads}
    skipped = len(names) - len(self.stored)
    log.warning("%s: multimodal checkpoint: loading its language model only; the vision tower, projector and "
                "multi-token prediction head (%d tensors) are skipped", path, skipped)
    self.file_of = {name: self.file_of[stored] for name, stored in self.stored.items()}

  def names(self) -> set[str]:
    return set(self.file_of)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handles[self.file_of[name]].get_slice(self.stored.get(name, name)).get_shape())

  def read(self, name: str) -> np.ndarray:
    return self._handles[self.file_of[name]].get_tensor(self.stored.get(name, name))


def _check_names(expected: set[str], present: set[str], path: Path):
  missing = sorted(expected - present)
  unexpected = sorted(n for n in present - expected if not n.endswith(_IGNORED_SUFFIXES) and not n.startswith("mtp."))
  problems = [f"{what} tensors {names}" for what, names in (("missing", missing), ("unexpected", unexpected)) if names]
  if problems:
    raise ValueError(f"{path}: checkpoint does not match its config.json: " + "; ".join(problems))


def _ignored_tensors(cfg: ModelConfig) -> set[str]:
  """Tensors a checkpoint may hold that the model does not use: those transformers' Gemma4 ignores on loading
  (`_keys_to_ignore_on_load_unexpected`), the key / value projections and norms of layers that share another
  layer's keys and values."""
  return {f"model.layers.{i}.self_attn.{t}.weight" for i in range(cfg.num_layers) if cfg.kv_source(i) is not None
          for t in ("k_proj", "v_proj", "k_norm", "v_norm")}


def _place(x: np.ndarray, sharding) -> jax.Array:
  if sharding is None:
    return jax.device_put(x)
  # Each addressable device gets only its slice of the host array.
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: np.ascontiguousarray(x[idx]))


def read_hf_config(path) -> dict[str, Any]:
  config_file = Path(path) / "config.json"
  if not config_file.exists():
    raise FileNotFoundError(f"{config_file} does not exist (expected a Hugging Face checkpoint directory)")
  return json.loads(config_file.read_text())


def from_pretrained(path, *, param_dtype: str | None = None, dtype: str | None = None,
                    mesh: jax.sharding.Mesh | None = None, rules=None, **config_overrides) -> Transformer:
  """Loads a checkpoint directory of a family of config.FAMILIES (config.json + safetensors, single or sharded).

  param_dtype / dtype: parameter and compute dtype ('float32', 'bfloat16'); default float32 whatever the
  checkpoint's dtype. With `mesh`, each parameter is placed on the sharding given by its logical axes and
  `rules` (default `sharding.LOGICAL_RULES`). Other keyword arguments override ModelConfig fields (e.g.
  remat=True). Raises ValueError naming any missing, unexpected or mis-shaped tensor.
  """
  path = Path(path)
  dtypes = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype)) if v is not None}
  hf = read_hf_config(path)
  cfg = from_hf_config(hf, **config_overrides, **dtypes)
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_state = nnx.split(abstract)
  flat = list(nnx.to_flat_state(abstract_state))
  shardings = None
  if mesh is not None:
    shardings = dict(nnx.to_flat_state(sharding_lib.param_shardings(abstract_state, mesh, rules)))

  ckpt = _Checkpoint(path)
  if hf.get("model_type") in MULTIMODAL:
    ckpt.language_model_only(path)
  expected = {one for p, v in flat for one in _hf_names(*hf_name(p, cfg.family), v.get_value().shape)}
  present = ckpt.names() - _ignored_tensors(cfg)
  tied_head = cfg.tie_word_embeddings and "lm_head.weight" in present
  _check_names(expected, present - ({"lm_head.weight"} if tied_head else set()), path)

  loaded = []
  for p, var in flat:
    name, kind = hf_name(p, cfg.family)
    shape = tuple(var.get_value().shape)
    want = _hf_shape(shape, kind)
    for one in _hf_names(name, kind, shape):
      if (got := ckpt.shape(one)) != want:
        raise ValueError(f"{path}: tensor {one} has shape {list(got)}, expected {list(want)} from config.json")
    x = _read_ours(ckpt, name, kind, shape).astype(cfg.jnp_param_dtype)
    loaded.append((p, var.replace(_place(x, None if shardings is None else shardings[p].get_value()))))
    del x
  if tied_head:
    head, embed = ckpt.read("lm_head.weight"), ckpt.read("model.embed_tokens.weight")
    if head.shape != embed.shape or not np.array_equal(head, embed):
      raise ValueError(f"{path}: tie_word_embeddings=True but tensor lm_head.weight differs from "
                       f"model.embed_tokens.weight")
  return nnx.merge(graphdef, nnx.from_flat_state(loaded))


def _host_array(x: jax.Array) -> np.ndarray:
  if not x.is_fully_addressable:  # multi-host: every process takes part in the gather.
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def _plan_shards(entries: list[tuple], max_shard_bytes: int) -> list[list]:
  """Consecutive entries, each (..., bytes), grouped into shards of at most max_shard_bytes (one entry at least)."""
  shards, current, size = [], [], 0
  for entry in entries:
    nbytes = entry[3]
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = [], 0
    current.append(entry)
    size += nbytes
  shards.append(current)
  return shards


def save_pretrained(model: Transformer, path, *, source=None, max_shard_bytes: int = 4 * 2**30):
  """Writes `model` as a Hugging Face checkpoint (config.json + safetensors) loadable by transformers.

  The architecture comes from `model.cfg.family` (config.FAMILIES); tensors keep the parameter
  dtype. Above `max_shard_bytes` the weights are split into model-0000i-of-0000n.safetensors files plus an
  index. `source`: the checkpoint directory the model was loaded from: its other config.json entries (token
  ids, ...), tokenizer files and generation_config.json are carried over.
  """
  path = Path(path)
  cfg: ModelConfig = model.cfg
  hf = to_hf_config(cfg)
  if source is not None:
    src = read_hf_config(source)
    if src.get("model_type") in MULTIMODAL:  # written as its language model alone, with the token ids
      src = {**{k: src[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in src},
             **src.get("text_config", {})}
    src.pop("torch_dtype", None)
    hf = {**src, **hf}
    if from_hf_config(hf, param_dtype=cfg.param_dtype, dtype=cfg.dtype, remat=cfg.remat,
                      attention=cfg.attention, decode_attention=cfg.decode_attention, moe_impl=cfg.moe_impl) != cfg:
      raise ValueError(f"save_pretrained(source={source}): that checkpoint's config.json describes a "
                       f"different model than model.cfg")
  state = nnx.state(model, nnx.Param)
  groups: dict[str, list] = {}  # HF name -> [(path, kind, bytes)]: gpt-oss's gate and up share one tensor
  for p, var in nnx.to_flat_state(state):
    name, kind = hf_name(p, cfg.family)
    value = var.get_value()
    groups.setdefault(name, []).append((p, kind, value.size * value.dtype.itemsize))
  entries = [(name, members, None, sum(m[2] for m in members)) for name, members in groups.items()]
  shards = _plan_shards(entries, max_shard_bytes)
  n = len(shards)
  names = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
  arrays = dict(nnx.to_flat_state(state))

  writer = jax.process_index() == 0
  if writer:
    path.mkdir(parents=True, exist_ok=True)
    # Stale weight files from an earlier save would shadow or contradict the new ones.
    for old in list(path.glob("model*.safetensors")) + [path / INDEX_FILE]:
      old.unlink(missing_ok=True)
  weight_map = {}
  for file_name, shard in zip(names, shards):
    tensors = {one: x for name, members, _, _ in shard for one, x in _hf_tensors(
        name, [(kind, _host_array(arrays[p].get_value())) for p, kind, _ in members]).items()}
    if writer:
      save_file(tensors, str(path / file_name), metadata={"format": "pt"})
    weight_map.update({name: file_name for name in tensors})
    del tensors
  if not writer:
    return
  if n > 1:
    index = {"metadata": {"total_size": sum(e[3] for e in entries)}, "weight_map": dict(sorted(weight_map.items()))}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
  (path / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
  if source is not None:
    for f in _SIDE_FILES:
      if (Path(source) / f).exists() and Path(source).resolve() != path.resolve():
        shutil.copy2(Path(source) / f, path / f)


# The class AutoTokenizer (transformers 5) gives a tokenizer saved as `TokenizersBackend`, by its model_type: Qwen 2's
# own pre-tokenizer, else the saved class (tests/model/test_hf_io.py compares them at the pinned transformers).
_SAVED_BACKEND_LOADS_AS = {"llama": "TokenizersBackend", "qwen2": "Qwen2Tokenizer", "qwen3": "TokenizersBackend",
                           "gemma3_text": "TokenizersBackend", "gemma3": "TokenizersBackend"}


def load_tokenizer(path):
  """The tokenizer of a local directory (never the network), chat template included: AutoTokenizer's choice, named
  directly for a saved `TokenizersBackend` of a model_type above (importing AutoTokenizer imports torch where it is
  installed, 1.7 s of each run's start); any other tokenizer, or one with its own code, through AutoTokenizer."""
  import transformers
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory {path} does not exist")
  saved, model = ({} if not (Path(path) / name).exists() else json.loads((Path(path) / name).read_text())
                  for name in ("tokenizer_config.json", "config.json"))
  known = saved.get("tokenizer_class") == "TokenizersBackend" and "auto_map" not in saved
  direct = getattr(transformers, _SAVED_BACKEND_LOADS_AS.get(model.get("model_type"), "") if known else "", None)
  return (direct or transformers.AutoTokenizer).from_pretrained(str(path), local_files_only=True)
