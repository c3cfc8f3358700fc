"""A run's policy as a Hugging Face model directory (grpo-export, and `checkpoint.export_hf` at the end of a
run).

The directory holds config.json and safetensors (in the parameter dtype), the tokenizer files and chat template
of `model.hf_path`, and generation_config.json with `eos_token_id` set to the run's stop tokens (the tokenizer's
eos and the end-of-turn tokens the sampler stops at: `tasks.stop_ids`), so that transformers' `generate` stops
where the run's sampler stopped. A run without a checkpoint (a fresh model on the character tokenizer of the
synthetic task) has no Hugging Face tokenizer: its weights and config are written alone, and a message says so.
"""
from __future__ import annotations

import json
import os

import jax
import ml_collections
from flax import nnx

from grpo_jax import config as config_lib
from grpo_jax import storage
from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.data.tasks import stop_ids
from grpo_jax.model import hf_io
from grpo_jax.model import lora
from grpo_jax.persist.checkpoint import abstract_like, restore_lora_base, restore_params
from grpo_jax.persist.layout import RunFiles, committed_steps

GENERATION_CONFIG = "generation_config.json"


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run saved in WORKDIR/config.json."""
  path = RunFiles(workdir).config
  if not storage.exists(path):
    raise FileNotFoundError(f"{path} does not exist (is {workdir} a training workdir?)")
  return config_lib.saved_with_defaults(json.loads(storage.read_text(path)))


def restore_run_params(workdir: str, params, step: int | None = None):
  """(parameters of checkpoint `step` of the run in `workdir`, or of its latest; that step). `params`: a tree of
  the same structure (the freshly built model's), whose shapes, dtypes and shardings the restore takes; with
  LoRA adapters in it, the adapters come from the checkpoint and the base from `restore_lora_base`."""
  files = RunFiles(workdir)
  directory = storage.absolute(files.checkpoints)
  # The committed steps, read without a CheckpointManager: its clean-up thread would outlive a refusal below.
  steps = committed_steps(directory)
  if step is None:
    if not steps:
      raise FileNotFoundError(f"{directory} holds no checkpoint")
    step = steps[-1]
  elif step not in steps:
    raise FileNotFoundError(f"{directory} has no checkpoint {step}; it has {steps}")
  if not lora.count(params)[0]:  # no adapters: a full fine-tuning run
    restored, _ = restore_params(directory, step, abstract_like(params))
    return restored, step
  # A LoRA run's checkpoints hold the adapters: the frozen base is its starting point (checked).
  adapters, base = lora.split_adapters(params)
  adapters, meta = restore_params(directory, step, abstract_like(adapters), item="adapters")
  base = restore_lora_base(files.warmstart, base, meta.get("lora_base_fingerprint"))
  return lora.join(adapters, base), step


def write_hf_model(graphdef, params, hf_path: str, tokenizer, out: str, log=print) -> str:
  """Writes the policy `nnx.merge(graphdef, params)` to `out` (module docstring); returns `out`. LoRA adapters
  are merged into the weights they adapt (`lora.merged`): the result is a plain checkpoint of the base's shapes.

  `hf_path`: the run's model.hf_path, whose files (tokenizer, generation config) are carried over ("": a fresh
  model). Call it on every process of a multi-host run (the parameters are gathered); process 0 writes. A gs:// or
  s3:// `out` is written locally first (storage.LocalCopy).
  """
  main = jax.process_index() == 0
  model = nnx.merge(graphdef, params)
  if lora.has_adapters(model):
    model = lora.merged(model)
    log("[export] LoRA adapters merged into the base weights")
  with storage.LocalCopy(out, upload=main) as directory:
    hf_io.save_pretrained(model, directory.local, source=storage.local_dir(hf_path) if hf_path else None)
    if main and isinstance(tokenizer, CharTokenizer):
      log(f"[export] {out}: weights and config only; this run's character tokenizer has no Hugging Face form")
    elif main:
      _write_generation_config(os.path.join(directory.local, GENERATION_CONFIG), tokenizer)
  if main:
    log(f"[export] wrote {out}")
  return out


def _write_generation_config(path: str, tokenizer) -> None:
  generation = {}
  if os.path.exists(path):  # the starting checkpoint's, carried over by save_pretrained
    with open(path) as f:
      generation = json.load(f)
  ids = list(stop_ids(tokenizer))
  generation.update(eos_token_id=ids if len(ids) > 1 else ids[0], pad_token_id=int(tokenizer.pad_token_id))
  if tokenizer.bos_token_id is not None:
    generation.setdefault("bos_token_id", int(tokenizer.bos_token_id))
  with open(path, "w") as f:
    json.dump(generation, f, indent=2, sort_keys=True)
    f.write("\n")
