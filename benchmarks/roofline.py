#!/usr/bin/env python
"""The floor of a GRPO step on an accelerator: each phase's FLOPs and HBM bytes from the shapes, read on a CPU.

  python benchmarks/roofline.py                                   # GSM8K recipe at the Qwen2.5 0.5B and 1.5B shapes
  python benchmarks/roofline.py --model gemma3-1b                 # any grpo_jax/commands/memory_estimate.py preset
  python benchmarks/roofline.py --update-widths 192,384 --decode-steps 400   # a measured run's trimmed widths
  python benchmarks/roofline.py --measured campaign.json          # fraction of the floor a GPU run reached
  python benchmarks/roofline.py --plan                            # the update's micro-batch and remat per device

The recipe (default experiments/gsm8k.py) is taken as written: prompts x G rows, prompt width P, C new tokens,
compute and parameter dtypes, remat, beta (the reference pass), micro-batch and its shared prompt forward
(`config.prompt_repeats`), log-prob chunk; only the model's shape is named (grpo_jax/commands/memory_estimate.py's PRESETS,
parameters counted exactly there). Shapes: L layers, D hidden, F MLP, N query / K kv heads of H, V vocabulary.

FLOPs count the matmuls (2 per multiply-add) as the code runs them: per token 2 x the layers' matmul weights
(q, k, v, o, gate, up, down), the attention's q.k^T and p.v over every key the einsum sees (4 N H per key and
layer: masked keys count, as the einsum computes them), and the LM head (2 D V) only where logits are taken.
Norms, rotary, softmax and sampling are left out (a few % of the total: tests/test_roofline.py). Bytes are the
HBM traffic no kernel can avoid: the weights each time a pass reads them, the KV cache, AdamW's state; not the
activations (a fused kernel keeps them on chip) nor the decode's logits (B x V float32 written and read: 0.31 GB,
9% of a 0.5B token step's bytes).

Phases (they run one after the other, so the step's floor is their sum):
- prefill: the R distinct prompts, once each (grpo_jax/sampling/sampler.py copies each prompt's KV cache to its
  G rows): R x P tokens over the S = P + C slots of the cache (the einsum reads all of them), the LM head at the
  last position; bytes: the weights as stored, the B rows' prompt slots of the cache written (the copy as written
  repeats all S slots).
- decode: C - 1 token steps (the prefill samples token 0) of B rows. Per step the weights (see DECODE_WEIGHTS)
  and the KV cache filled so far: P + t slots at step t, P + C/2 on average (the mid-length). The decode loop as
  written attends over all S slots every step (masked; `--decode-keys cache` counts that): the floor counts only
  the filled part, which an attention over the filled slots would read.
- reference: one forward of the reference model over the update's widths, micro-batch by micro-batch (weights
  read once per micro-batch); with the shared prompt forward (model.share_prompt_forward) each prompt runs once
  per `prompt_repeats` rows: R' x P prompt tokens (keys P) and B x C completion tokens (keys P + C).
- update: forward + backward = 3 forwards of matmul FLOPs, plus one forward recomputed with remat; the LM head's
  chunks are always rematerialized (grpo_jax/model/logprobs.py), so it counts 4 forwards. Bytes: per micro-batch
  the weights read 3 times (forward, remat forward, backward) and the accumulated gradient read and written, then
  AdamW once (7 x the parameter bytes: parameters, gradient, two moments read; parameters and moments written).

Floor of a phase = max(FLOPs / peak FLOP/s, bytes / peak bandwidth) at the peaks of PEAKS.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import NamedTuple

if __package__:  # imported as benchmarks.roofline (the tests) or run with python -m
  from benchmarks import memory_fit
else:  # python benchmarks/roofline.py: this folder is sys.path[0]
  import memory_fit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Dense bf16 matmul peak (FLOP/s) and HBM bandwidth (bytes/s), from the vendors' public pages:
# - H100 SXM: NVIDIA H100 Tensor Core GPU datasheet, "BF16 Tensor Core 1,979 teraFLOPS" (with sparsity; half dense),
#   "GPU memory bandwidth 3.35TB/s" (H100 SXM column).
# - H200: NVIDIA H200 Tensor Core GPU datasheet, "BF16 Tensor Core 1,979 TFLOPS" (with sparsity; half dense),
#   "GPU Memory Bandwidth 4.8TB/s" (H200 SXM column).
# - TPU v5e: Google Cloud's TPU v5e page (cloud.google.com/tpu/docs/v5e), "197 TFLOPs" bf16 and "819 GBps" HBM2
#   per chip.
PEAKS = {
    "H100 SXM": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "TPU v5e": (197e12, 819e9),
}
# Device memory per chip, bytes: what nvidia-smi reports as the total (H100 SXM 80GB: 81559 MiB; H200: 143771 MiB,
# docs/results.md's campaign of 2026-11-26) and Google Cloud's TPU v5e page ("16 GiB" HBM2 per chip).
HBM_BYTES = {
    "H100 SXM": 81559 * 2 ** 20,
    "H200": 143771 * 2 ** 20,
    "TPU v5e": 16 * 2 ** 30,
}
# Of it, an update plan may use MEM_FRACTION (JAX's pool: scripts/train.py sets XLA_PYTHON_CLIENT_MEM_FRACTION to
# 0.95) x PLAN_MARGIN: grpo_jax/commands/memory_estimate.py's figure was 6% under XLA's peak for the 0.5B update on
# an H200 (docs/results.md), and the pool fragments.
MEM_FRACTION = 0.95
PLAN_MARGIN = 0.8
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# How the decode loop reads the weights. The forward casts each float32 weight to the compute dtype at its use
# (`self.q_DxNxH[...].astype(dt)`), and XLA:GPU kept those casts inside the sampler's `lax.while_loop` (jax 0.11.2
# on an H200, bf16 compute): each token step read the float32 weights ("stored"). Since 2026-11-26 the sampler
# casts them once before the loop (`cast_for_compute`, grpo_jax/model/transformer.py), so a token step reads them
# in the compute dtype ("compute"); "stored" is the floor of the code before that.
DECODE_WEIGHTS = "compute"


class Workload(NamedTuple):
  """One GRPO step's shapes. B = prompts x group rows; the sampler's prompt width `prompt_width` (P) and its
  `new_tokens` (C) set the cache, S = P + C slots; the update and reference run on their own (trimmed) widths."""
  prompts: int = 16                   # R, distinct prompts per step
  group: int = 16                     # G, completions per prompt
  prompt_width: int = 256             # P of the sampler
  new_tokens: int = 512               # C of the sampler
  decode_steps: int | None = None     # token steps the decode ran (None: C - 1, the whole loop)
  decode_segment: int = 0             # sampling.decode_segment: the loop as written attends to its segment's slots
  update_prompt_width: int = 256
  update_completion_width: int = 512
  micro_batch: int = 16               # rows per forward/backward
  prompt_repeats: int = 16            # rows sharing one prompt forward (config.prompt_repeats)
  logprob_chunk: int = 128
  remat: bool = True
  reference: bool = True              # beta > 0
  old_logprobs: bool = False          # not on-policy (num_iterations > 1 or several mini-batches): one more forward
  offload_ref: bool = False           # model.offload_ref_params: the reference's weights in host memory
  param_dtype: str = "float32"
  dtype: str = "bfloat16"

  @property
  def rows(self) -> int:
    return self.prompts * self.group


class Phase(NamedTuple):
  name: str
  flops: float
  bytes: float
  note: str = ""


# ---- formulas (pure; shapes in the names) ----

def layer_matmul_weights(cfg) -> int:
  """Multiply-adds per token in one layer's projections: q, k, v (D x (N + 2K) H), o (N H x D), MLP 3 D F."""
  D, H = cfg.hidden_size, cfg.head_dim
  return D * H * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * D * cfg.intermediate_size


def attention_keys_L(cfg, cache_slots: int | None, new_tokens: int) -> list[int]:
  """Keys each query attends to, per layer, in a forward of `new_tokens` queries (grpo_jax/model/transformer.py):
  without a cache (training, T = new_tokens) all T keys; with a cache of `cache_slots` positions, the whole
  cache in a global layer; in a sliding layer its ring of W = min(window, slots), plus the T new keys when
  T > 1 (`Attention._ring_block`)."""
  if cache_slots is None:
    return [new_tokens] * cfg.num_layers
  out = []
  for i in range(cfg.num_layers):
    if cfg.is_sliding(i):
      ring = min(cfg.sliding_window, cache_slots)
      out.append(ring if new_tokens == 1 else ring + new_tokens)
    else:
      out.append(cache_slots)
  return out


def forward_flops(cfg, tokens: float, keys_L: list[float], head_tokens: float) -> float:
  """Matmul FLOPs of one forward: `tokens` queries through the layers (2 x weights each), each attending to
  keys_L[l] keys in layer l (q.k^T and p.v: 4 N H per key), and the LM head (2 D V) at `head_tokens` positions."""
  nh = cfg.num_heads * cfg.head_dim
  return (2 * cfg.num_layers * layer_matmul_weights(cfg) * tokens + 4 * nh * tokens * sum(keys_L)
          + 2 * cfg.hidden_size * cfg.vocab_size * head_tokens)


def kv_cache_bytes(cfg, rows: float, slots_L: list[float], dtype: str) -> float:
  """Bytes of the keys and values of `rows` rows over slots_L[l] slots in layer l: 2 x rows x slots x K x H."""
  return 2 * rows * cfg.num_kv_heads * cfg.head_dim * sum(slots_L) * DTYPE_BYTES[dtype]


def floor_s(flops: float, nbytes: float, peak_flops: float, peak_bandwidth: float) -> float:
  """The roofline: a phase takes at least its FLOPs at the peak rate and its bytes at the peak bandwidth."""
  return max(flops / peak_flops, nbytes / peak_bandwidth)


def bound(flops: float, nbytes: float, peak_flops: float, peak_bandwidth: float) -> str:
  return "compute" if flops / peak_flops >= nbytes / peak_bandwidth else "memory"


# ---- phases ----

def prefill(cfg, num_params: int, w: Workload) -> Phase:
  """R prompts x P tokens into a cache of S = P + C slots; logits at the last position; the B rows' caches."""
  P, S = w.prompt_width, w.prompt_width + w.new_tokens
  flops = forward_flops(cfg, w.prompts * P, attention_keys_L(cfg, S, P), w.prompts)
  prompt_slots_L = [min(cfg.sliding_window, P) if cfg.is_sliding(i) else P for i in range(cfg.num_layers)]
  nbytes = num_params * DTYPE_BYTES[w.param_dtype] + kv_cache_bytes(cfg, w.rows, prompt_slots_L, w.dtype)
  return Phase(f"prefill ({w.prompts} x {P} tokens, once per prompt)", flops, nbytes)


def decode_keys_L(cfg, w: Workload, filled: bool = True) -> list[float]:
  """Mean keys per step and layer over the decode: step t (1..C-1) has written P + t slots (a sliding layer
  holds at most its window); `filled=False`: the slots the loop as written attends to, the whole cache of S
  slots, or with `w.decode_segment` = L those of step t's segment, P + its end (sampler.decode_segments)."""
  P, C, S = w.prompt_width, w.new_tokens, w.prompt_width + w.new_tokens
  steps = range(1, C)
  L = w.decode_segment if 0 < w.decode_segment < C else C
  width = {t: P + min(C, (t // L + 1) * L) for t in steps}  # the cache slots of step t's segment
  out = []
  for i in range(cfg.num_layers):
    cap = (lambda slots: min(cfg.sliding_window, slots)) if cfg.is_sliding(i) else (lambda slots: slots)
    keys = [cap(P + t) if filled else cap(width[t]) for t in steps]
    out.append(sum(keys) / max(1, len(keys)))
  return out


def decode_step(cfg, num_params: int, w: Workload, weights: str = DECODE_WEIGHTS, filled: bool = True) -> Phase:
  """One token step of the B rows at the mean cache length: the weights (in the parameter dtype, or the compute
  dtype when the casts are hoisted out of the loop) and the KV cache read once; one token's keys written."""
  keys_L = decode_keys_L(cfg, w, filled)
  flops = forward_flops(cfg, w.rows, keys_L, w.rows)
  weight_dtype = w.param_dtype if weights == "stored" else w.dtype
  nbytes = num_params * DTYPE_BYTES[weight_dtype] + kv_cache_bytes(cfg, w.rows, [k + 1 for k in keys_L], w.dtype)
  mean = sum(keys_L) / len(keys_L)
  return Phase(f"decode, per token step ({w.rows} rows, mean {mean:.0f} keys)", flops, nbytes,
               f"weights {weight_dtype}")


def steps_of(w: Workload) -> int:
  return w.new_tokens - 1 if w.decode_steps is None else w.decode_steps


def decode(cfg, num_params: int, w: Workload, weights: str = DECODE_WEIGHTS, filled: bool = True) -> Phase:
  one = decode_step(cfg, num_params, w, weights, filled)
  n = steps_of(w)
  return Phase(f"decode, {n} steps", one.flops * n, one.bytes * n, one.note)


def logprob_forward_flops(cfg, w: Workload) -> tuple[float, float]:
  """(layers and attention, LM head) FLOPs of one log-prob forward over the update's widths (all B rows):
  grpo_jax/model/logprobs.py's shared prompt forward when prompt_repeats > 1, else each row's P + C tokens.
  The head runs on C positions padded to whole chunks."""
  P, C, B = w.update_prompt_width, w.update_completion_width, w.rows
  if w.prompt_repeats > 1:
    prompts = B // w.prompt_repeats
    body = (forward_flops(cfg, prompts * P, attention_keys_L(cfg, P, P), 0)
            + forward_flops(cfg, B * C, attention_keys_L(cfg, P + C, C), 0))
  else:
    body = forward_flops(cfg, B * (P + C), attention_keys_L(cfg, None, P + C), 0)
  chunk = min(w.logprob_chunk, C)
  head = forward_flops(cfg, 0, [0] * cfg.num_layers, B * chunk * -(-C // chunk))
  return body, head


def reference(cfg, num_params: int, w: Workload) -> Phase:
  body, head = logprob_forward_flops(cfg, w)
  micro = w.rows // w.micro_batch
  return Phase(f"reference ({w.rows} rows x {w.update_prompt_width} + {w.update_completion_width})", body + head,
               micro * num_params * DTYPE_BYTES[w.param_dtype], f"{micro} micro-batches")


def update(cfg, num_params: int, w: Workload) -> Phase:
  """(3 + remat) forwards of the layers, 4 of the (always rematerialized) head, one more forward for the old
  log-probs when off-policy; weights read 3 times and the gradient accumulated per micro-batch, then AdamW."""
  body, head = logprob_forward_flops(cfg, w)
  flops = (3 + w.remat) * body + 4 * head + (body + head if w.old_logprobs else 0)
  pb = num_params * DTYPE_BYTES[w.param_dtype]
  micro = w.rows // w.micro_batch
  nbytes = micro * (3 * pb + 2 * pb) + 7 * pb + (micro * pb if w.old_logprobs else 0)
  return Phase(f"update ({micro} micro-batches of {w.micro_batch}{', remat' if w.remat else ''})", flops, nbytes)


def phases(cfg, num_params: int, w: Workload, weights: str = DECODE_WEIGHTS, filled: bool = True) -> dict:
  """{"prefill", "decode_step", "decode", "reference" (with beta > 0), "update"} -> Phase."""
  out = {"prefill": prefill(cfg, num_params, w), "decode_step": decode_step(cfg, num_params, w, weights, filled),
         "decode": decode(cfg, num_params, w, weights, filled)}
  if w.reference:
    out["reference"] = reference(cfg, num_params, w)
  out["update"] = update(cfg, num_params, w)
  return out


def step_totals(ps: dict) -> dict[str, dict]:
  """FLOPs, bytes and floor per peak of what a measured step times: sample (prefill + decode), reference,
  update, step (their sum; each phase is bounded on its own, so the floors add up)."""
  by = {"sample": [ps["prefill"], ps["decode"]], "reference": [ps["reference"]] if "reference" in ps else [],
        "update": [ps["update"]]}
  by["step"] = by["sample"] + by["reference"] + by["update"]
  out = {}
  for k, group in by.items():
    out[k] = {"flops": sum(p.flops for p in group), "bytes": sum(p.bytes for p in group),
              "floor_s": {dev: sum(floor_s(p.flops, p.bytes, *peak) for p in group) for dev, peak in PEAKS.items()}}
  return out


# ---- the model and the recipe ----

def model_config(name: str, w: Workload):
  from grpo_jax.commands import memory_estimate as me
  return me.model_config(name, w.param_dtype, w.dtype)


def num_params(cfg) -> int:
  """Exact parameter count (grpo_jax/commands/memory_estimate.py counts the model's abstract parameters)."""
  from grpo_jax.commands import memory_estimate as me
  return me.param_elements(cfg, me.Mesh(1, 1, 1))[0]


def recipe_workload(spec: str) -> Workload:
  """The Workload of `experiments/<recipe>.py[:preset]` as written."""
  return config_workload(memory_fit.recipe_config(spec))


def config_workload(c) -> Workload:
  """The Workload of a run config (a recipe's ConfigDict)."""
  from grpo_jax.settings import Settings
  B, P, C, mini, micro = memory_fit.shapes(c)
  return Workload(prompts=c.grpo.prompts_per_step, group=c.grpo.group_size, prompt_width=P, new_tokens=C,
                  update_prompt_width=P, update_completion_width=C, micro_batch=micro,
                  prompt_repeats=Settings.from_config(c).prompt_repeats, logprob_chunk=c.model.logprob_chunk_size,
                  remat=bool(c.model.remat), reference=c.grpo.beta > 0, offload_ref=bool(c.model.offload_ref_params),
                  old_logprobs=not (c.grpo.num_iterations == 1 and mini == B),
                  param_dtype=c.model.param_dtype, dtype=c.model.dtype)


# ---- the update's micro-batch size and remat, chosen from the floor and the memory estimate ----

def with_micro_batch(w: Workload, micro: int) -> Workload:
  """`w` with `micro` rows per forward/backward; the shared prompt forward keeps gcd(micro, G) rows per prompt."""
  return w._replace(micro_batch=micro, prompt_repeats=math.gcd(micro, w.group) if w.prompt_repeats > 1 else 1)


def run_memory_bytes(cfg, w: Workload) -> int:
  """grpo_jax/commands/memory_estimate.py's bytes per device for the run on one device: parameters, gradients,
  AdamW, the reference, the sampler's KV cache and the update's activations (with or without remat). The KV cache
  is freed before the update, so it stands as headroom there."""
  from grpo_jax.commands import memory_estimate as me
  est = me.estimate(cfg, me.Mesh(1, 1, 1), me.Workload(
      sampler_batch=w.rows, prompt_len=w.prompt_width, new_tokens=w.new_tokens, micro_batch=w.micro_batch,
      logprob_chunk=w.logprob_chunk, use_ref=w.reference, offload_ref=w.offload_ref,
      prompt_repeats=w.prompt_repeats))
  return est["total_remat"] if w.remat else est["total"]


def update_plans(cfg, n: int, w: Workload) -> list[dict]:
  """Every (micro-batch, remat) the recipe could run its update with: micro-batches that are powers of two and
  divide the rows, remat on and off. Each: micro_batch, remat, flops, bytes (the update phase), memory (bytes per
  device, run_memory_bytes), and per PEAKS device floor_s and fits (memory <= HBM x MEM_FRACTION x PLAN_MARGIN)."""
  plans = []
  for micro in (2 ** i for i in range(w.rows.bit_length())):
    if w.rows % micro:
      continue
    for remat in (True, False):
      v = with_micro_batch(w, micro)._replace(remat=remat)
      ph, memory = update(cfg, n, v), run_memory_bytes(cfg, v)
      plans.append({"micro_batch": micro, "remat": remat, "flops": ph.flops, "bytes": ph.bytes, "memory": memory,
                    "floor_s": {d: floor_s(ph.flops, ph.bytes, *pk) for d, pk in PEAKS.items()},
                    "fits": {d: memory <= HBM_BYTES[d] * MEM_FRACTION * PLAN_MARGIN for d in PEAKS}})
  return plans


def choose_update_plan(plans: list[dict], device: str) -> dict | None:
  """The plan that fits `device` with the lowest floor; within 1% of it, the largest micro-batch (fewer, larger
  matmuls), then remat off. None when nothing fits (shard the model: --mesh, docs/scaling.md)."""
  fitting = [p for p in plans if p["fits"][device]]
  if not fitting:
    return None
  best = min(p["floor_s"][device] for p in fitting)
  near = [p for p in fitting if p["floor_s"][device] <= 1.01 * best]
  return max(near, key=lambda p: (p["micro_batch"], not p["remat"]))


def plan_table(plans: list[dict], w: Workload) -> str:
  head = ("| micro-batch | remat | update FLOPs | memory (estimate) | "
          + " | ".join(f"{d} floor" for d in PEAKS) + " |\n|" + "---|" * (4 + len(PEAKS)))
  lines = [head]
  chosen = {d: choose_update_plan(plans, d) for d in PEAKS}
  for p in plans:
    cells = []
    for d in PEAKS:
      cell = _seconds(p["floor_s"][d]) if p["fits"][d] else "does not fit"
      cells.append(f"**{cell}**" if chosen[d] is p else cell)
    as_written = p["micro_batch"] == w.micro_batch and p["remat"] == w.remat
    lines.append(f"| {p['micro_batch']}{' (recipe)' if as_written else ''} | {'on' if p['remat'] else 'off'} "
                 f"| {_si(p['flops'])} | {p['memory'] / 2 ** 30:.1f} GiB | " + " | ".join(cells) + " |")
  lines.append("Chosen (bold): " + "; ".join(
      f"{d}: " + (f"micro-batch {c['micro_batch']}, remat {'on' if c['remat'] else 'off'}" if c else "none fits")
      for d, c in chosen.items()))
  return "\n".join(lines)


# ---- a measured run (benchmarks/gpu_campaign.py's JSON) ----

def device_peak(device: str) -> str | None:
  """PEAKS' key for a jax device_kind, or None: an H100 SXM (not the PCIe or NVL boards, whose peaks differ),
  an H200, a TPU v5e (device_kind 'TPU v5 lite')."""
  d = device.lower()
  if "h200" in d:
    return "H200"
  if "h100" in d and "pcie" not in d and "nvl" not in d:
    return "H100 SXM"
  if "v5e" in d or "v5 lite" in d or "v5litepod" in d:
    return "TPU v5e"
  return None


def measured_workload(result: dict, base: Workload) -> Workload:
  """`base` (the recipe) with the shapes a measured step reports: rows, widths, micro-batch, beta, remat, dtypes."""
  micro = int(result.get("micro_batch", base.micro_batch))
  prompts = int(result.get("rows", base.rows)) // base.group
  repeats = math.gcd(micro, base.group) if base.prompt_repeats > 1 else 1
  return base._replace(
      prompts=prompts, prompt_width=int(result.get("prompt_len", base.prompt_width)),
      new_tokens=int(result.get("new_tokens", base.new_tokens)),
      update_prompt_width=int(result.get("update_prompt_width", base.update_prompt_width)),
      update_completion_width=int(result.get("update_completion_width", base.update_completion_width)),
      micro_batch=micro, prompt_repeats=repeats, remat=bool(result.get("remat", base.remat)),
      reference=float(result.get("beta", 0.04 if base.reference else 0.0)) > 0,
      param_dtype=result.get("param_dtype", base.param_dtype), dtype=result.get("dtype", base.dtype))


MEASURED_PHASES = (("sample", "sample_s"), ("reference", "reference_s"), ("update", "update_s"), ("step", "step_s"))


def measured_rows(data: dict, base: Workload = Workload(), weights: str = DECODE_WEIGHTS) -> list[dict]:
  """One dict per step part ("step_*") and phase of a campaign JSON: part, status, model, device, peak (PEAKS key
  or None), phase, seconds, flops, bytes, floor_s, floor_fraction (floor / measured), mfu (FLOPs / (seconds x peak
  FLOP/s)). A part whose status is not "ok", or whose model is not a preset, gives one dict with its status."""
  device = data.get("device", "")
  peak = device_peak(device)
  rows = []
  for part, entry in sorted(data.get("parts", {}).items()):
    if not part.startswith("step_"):
      continue
    status = entry.get("status", "missing")
    result = entry.get("result") or {}
    if status != "ok" or "median" not in result:
      rows.append({"part": part, "status": status if status != "ok" else "no median", "device": device,
                   "peak": peak})
      continue
    w = measured_workload(result, base)
    name = result.get("model", part[len("step_"):])
    try:
      cfg, n = model_and_params(name, w)
    except (OSError, ValueError, KeyError):
      rows.append({"part": part, "status": f"model {name!r} is not a preset", "device": device, "peak": peak})
      continue
    totals = step_totals(phases(cfg, n, w, weights))
    for phase, key in MEASURED_PHASES:
      seconds = result["median"].get(key)
      t = totals[phase]
      fl = t["floor_s"][peak] if peak else None
      rows.append({"part": part, "status": status, "model": name, "device": device, "peak": peak,
                   "phase": phase, "seconds": seconds, "flops": t["flops"], "bytes": t["bytes"], "floor_s": fl,
                   "floor_fraction": fl / seconds if fl and seconds else None,
                   "mfu": t["flops"] / (seconds * PEAKS[peak][0]) if peak and seconds else None})
  return rows


def model_and_params(name: str, w: Workload):
  cfg = model_config(name, w)
  return cfg, num_params(cfg)


# ---- printing ----

def _si(x: float) -> str:
  return f"{x:.3g}" if x < 1e3 else f"{x:.2e}".replace("e+", "e")


def _seconds(s: float | None) -> str:
  if s is None:
    return "n/a"
  return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def table(ps: dict) -> str:
  head = ("| phase | FLOPs | HBM bytes | FLOP/byte | " + " | ".join(f"{d} floor" for d in PEAKS) + " |\n|"
          + "---|" * (4 + len(PEAKS)))
  lines = [head]
  for p in ps.values():
    cells = [f"{_seconds(floor_s(p.flops, p.bytes, *pk))} ({bound(p.flops, p.bytes, *pk)[0]})"
             for pk in PEAKS.values()]
    name = p.name + (f"; {p.note}" if p.note else "")
    lines.append(f"| {name} | {_si(p.flops)} | {_si(p.bytes)} | {p.flops / p.bytes:.0f} | " + " | ".join(cells) + " |")
  totals = step_totals(ps)["step"]
  lines.append(f"| **step** (prefill + decode + reference + update) | {_si(totals['flops'])} | {_si(totals['bytes'])} "
               f"| | " + " | ".join(f"**{_seconds(totals['floor_s'][d])}**" for d in PEAKS) + " |")
  return "\n".join(lines)


def describe(name: str, n: int, w: Workload) -> str:
  return (f"{name}: {n / 1e6:.1f}M parameters ({w.param_dtype}, {n * DTYPE_BYTES[w.param_dtype] / 1e9:.2f} GB), "
          f"compute {w.dtype}; {w.prompts} prompts x G {w.group} = {w.rows} rows, prompt width {w.prompt_width}, "
          f"{w.new_tokens} new tokens; update widths {w.update_prompt_width} + {w.update_completion_width}, "
          f"micro-batch {w.micro_batch} (prompt forward shared by {w.prompt_repeats} rows), "
          f"remat {'on' if w.remat else 'off'}, reference {'on' if w.reference else 'off'}")


def measured_table(rows: list[dict]) -> str:
  lines = ["| part | phase | measured | floor | floor / measured | MFU |", "|---|---|---|---|---|---|"]
  for r in rows:
    if "phase" not in r:
      lines.append(f"| {r['part']} | {r['status']} | | | | |")
      continue
    frac = "n/a" if r["floor_fraction"] is None else f"{100 * r['floor_fraction']:.1f}%"
    mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    lines.append(f"| {r['part']} | {r['phase']} | {_seconds(r['seconds'])} | {_seconds(r['floor_s'])} | {frac} "
                 f"| {mfu} |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--recipe", default=os.path.join(ROOT, "experiments", "gsm8k.py"),
                 help="experiments/<recipe>.py[:preset], taken as written (default: the GSM8K recipe)")
  p.add_argument("--model", action="append", help="a grpo_jax/commands/memory_estimate.py preset (repeatable; default "
                 "qwen2.5-0.5b and qwen2.5-1.5b)")
  p.add_argument("--prompt-width", type=int, help="the sampler's prompt width P (default: the recipe's)")
  p.add_argument("--update-widths", help="PROMPT,COMPLETION widths of the update and reference (a measured run's "
                 "trimmed widths; default: the recipe's full widths)")
  p.add_argument("--decode-steps", type=int, help="decode token steps (default C - 1: no early stop)")
  p.add_argument("--micro-batch", type=int, help="rows per forward/backward (default: the recipe's)")
  p.add_argument("--decode-weights", choices=("stored", "compute"), default=DECODE_WEIGHTS,
                 help="decode reads the weights in the parameter dtype every step (stored: the code as written) "
                 "or in the compute dtype (compute: casts hoisted out of the loop)")
  p.add_argument("--decode-keys", choices=("filled", "cache"), default="filled",
                 help="decode reads the filled cache slots (filled: the floor) or all S slots (cache: as written)")
  p.add_argument("--decode-segment", type=int, default=0,
                 help="with --decode-keys cache: the loop in segments of this many steps (sampling.decode_segment)")
  p.add_argument("--measured", help="a benchmarks/gpu_campaign.py JSON: measured seconds against the floor")
  p.add_argument("--plan", action="store_true",
                 help="the update's micro-batch size and remat per device: floor and memory estimate of each choice")
  args = p.parse_args(argv)

  w = recipe_workload(args.recipe)
  if args.prompt_width:
    w = w._replace(prompt_width=args.prompt_width)
  if args.update_widths:
    up, uc = (int(x) for x in args.update_widths.split(","))
    w = w._replace(update_prompt_width=up, update_completion_width=uc)
  if args.decode_steps is not None:
    w = w._replace(decode_steps=args.decode_steps)
  if args.decode_segment:
    w = w._replace(decode_segment=args.decode_segment)
  if args.micro_batch:
    w = with_micro_batch(w, args.micro_batch)
  if args.measured:
    with open(args.measured) as f:
      data = json.load(f)
    rows = measured_rows(data, w, args.decode_weights)
    peak = device_peak(data.get("device", ""))
    print(f"{args.measured}: device {data.get('device', '?')!r} -> peaks "
          + (f"{peak} ({PEAKS[peak][0] / 1e12:.0f} TFLOP/s, {PEAKS[peak][1] / 1e12:.2f} TB/s)" if peak else "unknown"))
    print(measured_table(rows))
    return 0
  for name in args.model or ["qwen2.5-0.5b", "qwen2.5-1.5b"]:
    cfg, n = model_and_params(name, w)
    print(describe(name, n, w))
    if args.plan:
      print(plan_table(update_plans(cfg, n, w), w))
    else:
      print(table(phases(cfg, n, w, args.decode_weights, args.decode_keys == "filled")))
    print()
  if args.plan:
    print(f"A plan fits where the estimate is at most {MEM_FRACTION} x {PLAN_MARGIN} of the device's memory "
          f"({', '.join(f'{d} {b / 2 ** 30:.1f} GiB' for d, b in HBM_BYTES.items())}).")
  peaks = "; ".join(f"{d} {f / 1e12:.0f} TFLOP/s bf16 dense, {b / 1e12:.3g} TB/s" for d, (f, b) in PEAKS.items())
  print(f"Peaks: {peaks} (sources: benchmarks/roofline.py's PEAKS). (c) compute-bound, (m) memory-bound.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
