"""Supervised warm start: teacher-forced cross-entropy on the task's gold answers, with the same model code.

Each example is the prompt (left-padded to max_prompt_length) followed by the answer's tokens and the stop
token (right-padded to max_new_tokens); the loss is the mean negative log-likelihood of the answer tokens,
computed by `completion_logprobs` exactly as the GRPO loss sees completions. Training stops at the first
held-out evaluation whose greedy accuracy reaches `target_accuracy` (or after `max_steps`), so a tiny model
starts GRPO from an imperfect but non-trivial policy.
"""
from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from grpo_jax import storage
from grpo_jax.config_checks import Section
from grpo_jax.model.logprobs import completion_logprobs
from grpo_jax.sampling.buckets import left_pad
from grpo_jax.train.rollout import encode_prompts, encode_text
from grpo_jax.train.state import init_opt_state


def validate_config(warmstart) -> None:
  """Checks that `warmstart.init_checkpoint` is a directory, local or on a store (its numbers: grpo_jax/settings.py's
  WarmstartSettings); raises ConfigError naming key and value."""
  s = Section(warmstart, "warmstart")
  if s["init_checkpoint"] and not storage.isdir(s["init_checkpoint"]):
    s.fail("init_checkpoint", "is not a directory (another run's workdir)")


def sft_batch(tokenizer, columns: dict[str, list], max_prompt_length: int, max_new_tokens: int):
  """(prompt_BxP, prompt_mask_BxP, target_BxC, target_mask_BxC) int32 numpy arrays for teacher forcing. The
  target is the row's `demonstration` when the task gives one (a worked solution), else its `answer`. A
  demonstration may be a list of [text, trained] segments (a multi-turn episode): segments with trained = 0
  (an environment's observations) are in the context but not targets."""
  prompts = encode_prompts(tokenizer, columns["prompt"], max_prompt_length)
  prompt_BxP, prompt_mask_BxP = left_pad(prompts, max_prompt_length, len(prompts), tokenizer.pad_token_id)
  target_BxC = np.full((len(prompts), max_new_tokens), tokenizer.pad_token_id, np.int32)
  target_mask_BxC = np.zeros((len(prompts), max_new_tokens), np.int32)
  for i, answer in enumerate(columns.get("demonstration", columns["answer"])):
    segments = answer if isinstance(answer, (list, tuple)) else [(str(answer), 1)]
    ids, trained = [], []
    for text, is_target in segments:
      piece = encode_text(tokenizer, str(text))
      ids += piece
      trained += [int(bool(is_target))] * len(piece)
    ids, trained = ids + [tokenizer.eos_token_id], trained + [1]
    if len(ids) > max_new_tokens:
      raise ValueError(f"answer {answer!r} plus the stop token is {len(ids)} tokens, more than "
                       f"config.sampling.max_new_tokens={max_new_tokens} (env.max_episode_tokens with an "
                       "environment)")
    target_BxC[i, :len(ids)] = ids
    target_mask_BxC[i, :len(ids)] = trained
  return prompt_BxP, prompt_mask_BxP, target_BxC, target_mask_BxC


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, chunk_size: int, state_shardings=None):
  """jit(step(params, opt_state, prompt, prompt_mask, target, target_mask) -> (params, opt_state, loss))."""

  def loss_fn(params, prompt_BxP, prompt_mask_BxP, target_BxC, target_mask_BxC):
    model = nnx.merge(graphdef, params)
    logp_BxC, _ = completion_logprobs(model, prompt_BxP, prompt_mask_BxP, target_BxC, target_mask_BxC,
                                      1.0, chunk_size)
    mask = target_mask_BxC.astype(jnp.float32)
    return -jnp.sum(logp_BxC * mask) / jnp.maximum(jnp.sum(mask), 1.0)

  def step(params, opt_state, *batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  out_shardings = None if state_shardings is None else (*state_shardings, None)
  return jax.jit(step, donate_argnums=(0, 1), out_shardings=out_shardings)


def run_warmstart(ws_config, *, task, tokenizer, graphdef, params, max_prompt_length: int, max_new_tokens: int,
                  chunk_size: int, evaluate: Callable, log: Callable = print, mesh=None):
  """Trains until `evaluate(params)["eval/accuracy"] >= target_accuracy`. Returns (params, info).

  mesh: the device mesh the parameters live on (their shardings stay fixed, so the step compiles once).

  info: steps, rows (training rows consumed), the last evaluation's metrics, seconds, history
  (a list of {"step", "loss", "eval/accuracy"...} records, one per evaluation).
  """
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(ws_config.learning_rate))
  opt_state, opt_sh = init_opt_state(optimizer, params, mesh)
  param_sh = jax.tree.map(lambda x: x.sharding, params)
  step_fn = make_sft_step(graphdef, optimizer, chunk_size, (param_sh, opt_sh))
  bs = ws_config.batch_size
  start, losses = time.time(), []
  last_eval = evaluate(params)
  history = [{"step": 0, **last_eval}]  # one record per evaluation
  log(f"[warm start] step 0: held-out accuracy {last_eval['eval/accuracy']:.3f}")
  step = 0
  while last_eval["eval/accuracy"] < ws_config.target_accuracy and step < ws_config.max_steps:
    step += 1
    batch = sft_batch(tokenizer, task.train_rows((step - 1) * bs, bs), max_prompt_length, max_new_tokens)
    params, opt_state, loss = step_fn(params, opt_state, *batch)
    losses.append(loss)
    if step % ws_config.eval_every == 0 or step == ws_config.max_steps:
      last_eval = evaluate(params)
      mean_loss = float(np.mean(jax.device_get(losses)))
      losses = []
      history.append({"step": step, "loss": mean_loss, **last_eval})
      log(f"[warm start] step {step}: loss {mean_loss:.4f}, held-out accuracy "
          f"{last_eval['eval/accuracy']:.3f} (target {ws_config.target_accuracy})")
  return params, {"steps": step, "rows": step * bs, "eval": last_eval, "seconds": time.time() - start,
                  "history": history}
