#!/usr/bin/env python
"""The Tunix side of the benchmarks: google-tunix 0.1.7's GRPOLearner on a grpo_jax experiment's settings.

  bash benchmarks/setup_tunix.sh                                  # once: ./.venv-tunix (Tunix's own pins)
  .venv-tunix/bin/python -m benchmarks.tunix_grpo --spec SPEC.json --out RECORDS.json

benchmarks/step_bench.py writes SPEC.json from a grpo_jax config (`make_spec`, run in grpo_jax's environment)
and reads RECORDS.json back; nothing here is imported from Tunix until `run` (in Tunix's environment).

The mapping (`make_spec`): G -> num_generations; prompts per step -> the batch of prompts Tunix reads per
step (its batch sizes count prompts, ours count completions): mini_batch_size = all of them (one update per
step), train_micro_batch_size = compute_logps_micro_batch_size = micro_batch_size / G prompts, and
rollout_micro_batch_size = all prompts (grpo_jax samples the whole rollout at once); max_new_tokens,
max_prompt_length, temperature (top-p 1, no top-k); beta, epsilon, the KL estimator (k1 "kl", k2 "mse_kl",
k3 "low_var_kl"); AdamW with grpo_jax's lr, betas, eps, weight decay and global-norm clip, constant
schedule; the compute dtype. `model.remat` is refused: Tunix's RematConfig.BLOCK wraps its attention in
nnx.remat, which fails inside its sampler's jitted while loop under flax 0.12.8 ("Cannot mutate Param from a
different trace level"), and the sampler shares the actor's modules. The reward is grpo_jax's own function of
that name (its module needs numpy only), on the prompt texts grpo_jax renders (chat template included).

Three pitfalls of Tunix 0.1.7, handled here:
  * its Llama 3 model ignores the config's `rope_theta` (apply_rope is called with its default 1e6);
    SmolLM2's is 1e5, so `apply_rope` is wrapped to pass the checkpoint's value;
  * its prompts are left-padded with the tokenizer's pad id and every pad id is masked out, so a pad id equal
    to SmolLM2's `<|im_end|>` (its tokenizer's default) would erase the chat template's turn ends from the
    prompts; the pad token is set to `<|endoftext|>`;
  * its vanilla sampler draws every rollout with the same PRNG key (RolloutConfig.seed, default
    PRNGKey(0)); each rollout call here gets fold_in(PRNGKey(seed), call number).

Records: per step the wall time from the end of the previous step (the first: from the start of
`learner.train`), the mean reward and completion length of its rollout; `launch_to_first_step_s` is the process's
start (Linux /proc, as grpo_jax's summary.json) to the end of the first step. With `snapshot_every` in the spec,
the policy is saved as a Hugging Face folder (`snapshot_dir`/STEP, by the inverse of Tunix's name mapping)
every that many steps and at the last, off the clock, for grpo_jax's evaluator (benchmarks/learning_race.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time

KL_MODES = {"k1": "kl", "k2": "mse_kl", "k3": "low_var_kl"}


def make_spec(config, rows: dict, steps: int) -> dict:
  """The settings Tunix gets from grpo_jax `config`; `rows`: {"prompt": [text], <reward column>: [...]}."""
  g, o, s = config.grpo, config.optim, config.sampling
  if config.model.remat:
    raise ValueError("model.remat: Tunix 0.1.7's rematerialized Llama attention (nnx.remat) fails inside its "
                     "sampler's while loop under flax 0.12.8; compare with remat off on every side")
  if g.micro_batch_size and g.micro_batch_size % g.group_size:
    raise ValueError(f"micro_batch_size {g.micro_batch_size} is not a multiple of G {g.group_size}: Tunix's "
                     "micro-batches count prompts")
  if g.num_iterations != 1 or g.mini_batch_size not in (0, g.prompts_per_step * g.group_size):
    raise ValueError("only one update per step (num_iterations 1, one mini-batch) is mapped to Tunix")
  if g.aggregation != "seq_mean_token_mean" or g.advantage != "grpo" or o.schedule != "constant" or o.warmup_steps:
    raise ValueError("aggregation / advantage / schedule not mapped to Tunix here")
  if g.epsilon_high not in (None, g.epsilon_low):
    raise ValueError("Tunix's GRPOConfig has one clip epsilon")
  micro_prompts = (g.micro_batch_size or g.prompts_per_step * g.group_size) // g.group_size
  return dict(
      model_dir=config.model.hf_path, dtype=config.model.dtype, seed=config.seed,
      steps=steps, prompts_per_step=g.prompts_per_step, group_size=g.group_size, micro_prompts=micro_prompts,
      max_new_tokens=s.max_new_tokens, max_prompt_length=s.max_prompt_length, temperature=s.temperature,
      beta=g.beta, epsilon=g.epsilon_low, kl_loss_mode=KL_MODES[g.kl_estimator],
      learning_rate=o.learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
      grad_clip_norm=o.grad_clip_norm, reward=config.eval.accuracy_reward,
      rows={k: list(v) for k, v in rows.items()})


def llama_config(model_lib, hf: dict):
  """Tunix's Llama 3 ModelConfig for a Hugging Face Llama config.json (SmolLM2 is a Llama)."""
  if hf.get("model_type") != "llama":
    raise SystemExit(f"tunix_grpo.py maps Llama checkpoints only, not model_type {hf.get('model_type')!r}")
  return model_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
      head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
      num_kv_heads=hf["num_key_value_heads"], norm_eps=hf["rms_norm_eps"],
      rope_theta=int(hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"]),  # transformers 5: the latter
      weight_tying=bool(hf.get("tie_word_embeddings")))


def hf_tensors(flat: dict, hf: dict) -> dict:
  """Tunix Llama 3 parameters {"layers.0.attn.q_proj.w": array, ...} -> Hugging Face tensors, the inverse of
  tunix/models/llama3/params.py's mapping (projections [D, N, H] -> [N*H, D], kernels transposed)."""
  out = {}
  for name, x in flat.items():
    parts = name.split(".")
    if name == "embedder.input_embedding":
      out["model.embed_tokens.weight"] = x
    elif name == "final_norm.w":
      out["model.norm.weight"] = x
    elif name == "lm_head.w":
      out["lm_head.weight"] = x.T
    elif parts[0] == "layers":
      prefix, rest = f"model.layers.{parts[1]}", ".".join(parts[2:])
      if rest in ("attn.q_proj.w", "attn.k_proj.w", "attn.v_proj.w"):   # [D, N, H]
        out[f"{prefix}.self_attn.{parts[3]}.weight"] = x.reshape(x.shape[0], -1).T
      elif rest == "attn.o_proj.w":                                      # [N, H, D]
        out[f"{prefix}.self_attn.o_proj.weight"] = x.reshape(-1, x.shape[-1]).T
      elif rest.startswith("mlp.") and parts[-1] == "kernel":            # [in, out]
        out[f"{prefix}.mlp.{parts[3]}.weight"] = x.T
      elif rest in ("input_layernorm.w", "post_attention_layernorm.w"):
        out[f"{prefix}.{parts[2]}.weight"] = x
      else:
        raise KeyError(f"no Hugging Face name for Tunix parameter {name}")
    else:
      raise KeyError(f"no Hugging Face name for Tunix parameter {name}")
  if hf.get("tie_word_embeddings"):
    out.pop("lm_head.weight", None)
  return out


def save_snapshot(model, model_dir: str, path: str) -> None:
  """The model as a Hugging Face folder: model.safetensors, with the other files of `model_dir` copied."""
  import shutil

  import numpy as np
  from flax import nnx
  from safetensors.numpy import save_file

  with open(os.path.join(model_dir, "config.json")) as f:
    hf = json.load(f)
  flat = {".".join(str(k) for k in path_): np.ascontiguousarray(np.asarray(v.get_value() if hasattr(v, "get_value")
                                                                           else v.value, np.float32))
          for path_, v in nnx.state(model, nnx.Param).flat_state()}
  os.makedirs(path, exist_ok=True)
  save_file({k: np.ascontiguousarray(v) for k, v in hf_tensors(flat, hf).items()},
            os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  for name in os.listdir(model_dir):
    if not name.endswith(".safetensors") and os.path.isfile(os.path.join(model_dir, name)):
      shutil.copy(os.path.join(model_dir, name), path)


def parity(spec: dict, reference: str) -> dict:
  """Max |logit difference| of Tunix's model against grpo_jax's logits in `reference` (an .npz of tokens_1xT
  and logits_1xTxV), with Tunix's RoPE as shipped and with the checkpoint's rope_theta: both sides must train
  the same function."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from tunix.models.llama3 import model as model_lib
  from tunix.models.llama3 import params as params_lib

  with open(os.path.join(spec["model_dir"], "config.json")) as f:
    config = llama_config(model_lib, json.load(f))
  ref = np.load(reference)
  tokens = jnp.asarray(ref["tokens_1xT"])
  T = tokens.shape[1]
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  model = params_lib.create_model_from_safe_tensors(spec["model_dir"], config, mesh, dtype=jnp.float32)
  causal = jnp.tril(jnp.ones((1, T, T), bool))
  shipped_rope = model_lib.apply_rope
  result = {}
  for name, rope in (("as shipped", shipped_rope),
                     ("checkpoint rope_theta", functools.partial(shipped_rope, rope_theta=config.rope_theta))):
    model_lib.apply_rope = rope
    logits, _ = model(tokens, jnp.arange(T)[None], None, causal)
    result[name] = float(np.abs(np.asarray(logits, np.float64) - ref["logits_1xTxV"]).max())
  model_lib.apply_rope = shipped_rope
  return result


def run(spec: dict, out: str) -> None:
  import jax
  import jax.numpy as jnp
  import optax
  from transformers import AutoTokenizer
  from tunix.models.llama3 import model as model_lib
  from tunix.models.llama3 import params as params_lib
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  from grpo_jax.rewards.registry import get_reward
  from grpo_jax.train.timing import seconds_since_launch

  with open(os.path.join(spec["model_dir"], "config.json")) as f:
    hf = json.load(f)
  config = llama_config(model_lib, hf)
  # Pitfall 1: Tunix's attention calls apply_rope without the config's rope_theta.
  model_lib.apply_rope = functools.partial(model_lib.apply_rope, rope_theta=config.rope_theta)

  tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
  tokenizer.pad_token = "<|endoftext|>"  # pitfall 2: not <|im_end|>, which the prompts contain
  eos_id = hf["eos_token_id"]  # SmolLM2-Instruct: 2, <|im_end|>, as grpo_jax's sampler stops

  # Auto axes, as Tunix's own meshes: jax.make_mesh's default (explicit axes) fails Tunix's embedding gather.
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[spec["dtype"]]
  load = lambda: params_lib.create_model_from_safe_tensors(spec["model_dir"], config, mesh, dtype=dtype)
  actor = load()
  reference = load() if spec["beta"] else None

  optimizer = optax.adamw(spec["learning_rate"], b1=spec["b1"], b2=spec["b2"], eps=spec["eps"],
                          weight_decay=spec["weight_decay"])
  if spec["grad_clip_norm"]:
    optimizer = optax.chain(optax.clip_by_global_norm(spec["grad_clip_norm"]), optimizer)
  R, micro = spec["prompts_per_step"], spec["micro_prompts"]
  rollout_config = base_rollout.RolloutConfig(
      max_tokens_to_generate=spec["max_new_tokens"], max_prompt_length=spec["max_prompt_length"],
      kv_cache_size=spec["max_prompt_length"] + spec["max_new_tokens"], temperature=spec["temperature"],
      top_p=1.0, top_k=None, eos_tokens=[eos_id], data_type=dtype)
  cluster = rl_cluster_lib.RLCluster(
      actor=actor, reference=reference, tokenizer=tokenizer,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={r: mesh for r in (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
                                          rl_cluster_lib.Role.ROLLOUT)},
          rollout_engine="vanilla", offload_to_cpu=False, rollout_config=rollout_config,
          training_config=rl_cluster_lib.RLTrainingConfig(
              actor_optimizer=optimizer, eval_every_n_steps=10**9, max_steps=spec["steps"],
              mini_batch_size=R, train_micro_batch_size=micro, rollout_micro_batch_size=R,
              compute_logps_micro_batch_size=micro, checkpoint_root_directory=None)))

  # Pitfall 3: a new sampling key for every rollout call.
  base_key, calls = jax.random.PRNGKey(spec["seed"]), [0]
  generate = cluster.rollout.generate

  def generate_with_fresh_key(prompts, config, **kw):
    calls[0] += 1
    return generate(prompts, dataclasses.replace(config, seed=jax.random.fold_in(base_key, calls[0])), **kw)

  cluster.rollout.generate = generate_with_fresh_key

  reward_fn = get_reward(spec["reward"])
  rollouts = []  # per reward call: mean reward, mean completion length in tokens

  def reward(prompts, completions, **columns):
    scores = [float(x or 0.0) for x in reward_fn(list(prompts), list(completions),
                                                 **{k: list(v) for k, v in columns.items()})]
    lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions]
    rollouts.append((sum(scores) / len(scores), sum(lengths) / len(lengths)))
    return scores

  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster, reward_fns=[reward],
      algo_config=grpo_learner.GRPOConfig(
          num_generations=spec["group_size"], num_iterations=1, beta=spec["beta"], epsilon=spec["epsilon"],
          kl_loss_mode=spec["kl_loss_mode"]))

  rows = spec["rows"]
  columns = [k for k in rows if k != "prompt"]
  batches = [{"prompts": rows["prompt"][i:i + R], **{k: rows[k][i:i + R] for k in columns}}
             for i in range(0, R * spec["steps"], R)]
  ends, step_calls, paused = [], [], [0.0]
  run_global_step = learner._run_global_step
  every = spec.get("snapshot_every", 0)

  def timed_global_step(*a, **kw):
    run_global_step(*a, **kw)
    ends.append(time.perf_counter() - paused[0])
    step_calls.append(len(rollouts))
    step = len(ends)
    if every and (step % every == 0 or step == spec["steps"]):  # saved off the clock
      t = time.perf_counter()
      save_snapshot(cluster.actor_trainer.model, spec["model_dir"], os.path.join(spec["snapshot_dir"], str(step)))
      paused[0] += time.perf_counter() - t

  learner._run_global_step = timed_global_step
  t0 = time.perf_counter()
  launch = seconds_since_launch()
  learner.train(batches)
  records, prev, prev_calls = [], t0, 0
  for i, (end, n) in enumerate(zip(ends, step_calls)):
    mine = rollouts[prev_calls:n] or [(float("nan"), float("nan"))]
    records.append({"step": i + 1, "seconds": end - prev, "reward": sum(r for r, _ in mine) / len(mine),
                    "completion_length": sum(c for _, c in mine) / len(mine),
                    "since_launch_s": None if launch is None else launch + end - t0})
    prev, prev_calls = end, n
  with open(out, "w") as f:
    json.dump({"steps": records, "launch_to_first_step_s": None if launch is None else launch + ends[0] - t0},
              f)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--spec", required=True, help="JSON written by make_spec")
  parser.add_argument("--out", required=True, help="where the step records go (JSON)")
  parser.add_argument("--parity", help="an .npz of grpo_jax's tokens_1xT and logits_1xTxV: compare, then exit")
  args = parser.parse_args(argv)
  with open(args.spec) as f:
    spec = json.load(f)
  if args.parity:
    with open(args.out, "w") as f:
      json.dump(parity(spec, args.parity), f)
  else:
    run(spec, args.out)


if __name__ == "__main__":
  main()
