#!/usr/bin/env python
"""Evaluates a run's checkpoint (or its starting model) greedily on its held-out or transfer prompts, and can
write the checkpoint out as a Hugging Face model.

  python scripts/evaluate.py runs/smollm2_s0                    # the latest checkpoint, held-out prompts
  python scripts/evaluate.py runs/smollm2_s0 --base             # the model the run started from (hf_path)
  python scripts/evaluate.py runs/smollm2_s0 --set three_digit  # a transfer set of the run's task
  python scripts/evaluate.py runs/smollm2_s0 --export out/policy   # + config.json, safetensors, tokenizer

Besides accuracy it splits the completions into: finished (a stop token within max_new_tokens) or cut off, and
correct or not, so a gain can be read as format / brevity (fewer cut off) or arithmetic (more finished ones
right). The run's own config (WORKDIR/config.json) gives the task, model, prompts and lengths.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_run_config(workdir: str):
  import ml_collections
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist (is {workdir} a training workdir?)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("workdir")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  parser.add_argument("--base", action="store_true", help="evaluate the starting model (model.hf_path)")
  parser.add_argument("--set", default="heldout", help="'heldout' or a transfer set of the task")
  parser.add_argument("--size", type=int, default=None, help="prompts (default: the run's eval.size)")
  parser.add_argument("--examples", type=int, default=4, help="completions to print")
  parser.add_argument("--export", default=None, help="write the parameters as a Hugging Face model here")
  args = parser.parse_args(argv)

  import jax
  import numpy as np

  from grpo_jax.model import sharding as sharding_lib
  from grpo_jax.train import loop
  from grpo_jax.train.checkpoint import Checkpointer, restore_params
  from grpo_jax.train.evaluation import evaluate

  config = load_run_config(args.workdir)
  size = args.size or config.eval.size
  tokenizer, task = loop.build_tokenizer_and_task(config)
  mesh = sharding_lib.make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
  graphdef, params = loop.build_model(config, tokenizer, mesh)
  source = "base model"
  if not args.base:
    directory = os.path.join(args.workdir, loop.CHECKPOINT_DIR)
    checkpointer = Checkpointer(directory, keep=config.checkpoint.keep, verify=False)
    steps = checkpointer.all_steps()
    checkpointer.close()
    step = args.step if args.step is not None else (steps[-1] if steps else None)
    if step is None:
      raise FileNotFoundError(f"{directory} holds no checkpoint; use --base for the starting model")
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
    params, _ = restore_params(directory, step, abstract)
    source = f"checkpoint {step}"
  columns = task.eval_rows(size) if args.set == "heldout" else task.transfer_rows(args.set, size)
  _, greedy, _ = loop.make_samplers(graphdef, config, tokenizer)
  metrics, details = evaluate(
      greedy, params, tokenizer, columns, reward_fns=loop.build_reward_fns(config),
      accuracy_reward=config.eval.accuracy_reward, batch_size=min(config.eval.batch_size, len(columns["prompt"])),
      max_prompt_length=config.sampling.max_prompt_length, key=jax.random.key(0), return_details=True)
  completions = details["completions"]
  correct, finished = details["accuracy"] >= 1.0, details["finished"]
  n = len(completions)
  print(f"{args.workdir} ({source}), {args.set}, {n} prompts: accuracy {metrics['eval/accuracy']:.3f}, "
        f"mean length {metrics['eval/mean_length']:.1f} tokens")
  print(f"  finished {finished.mean():.3f} (correct among them {correct[finished].mean() if finished.any() else 0:.3f})"
        f", cut off at max_new_tokens {1 - finished.mean():.3f} (correct among them "
        f"{correct[~finished].mean() if (~finished).any() else 0:.3f})")
  for i in range(min(args.examples, n)):
    question = columns.get("prompt")[i]
    print(f"  [{'right' if correct[i] else 'wrong'}] ...{question[-40:]!r} -> {completions[i]!r}")
  if args.export:
    from flax import nnx

    from grpo_jax.model import hf_io
    hf_io.save_pretrained(nnx.merge(graphdef, params), args.export, source=config.model.hf_path or None)
    print(f"wrote {args.export}")


if __name__ == "__main__":
  main()
