"""Held-out evaluation: greedy accuracy and mean reward, and pass@k when configured.

accuracy = mean over held-out prompts of the accuracy reward (e.g. exact_match, 0/1) of the greedy completion;
full_credit = the share of them whose accuracy reward is >= 1 (the same for a 0/1 reward; lower where a verifier
gives partial credit, as reasoning-gym's default one does for an answer inside a longer line).
pass@k = fraction of prompts for which at least one of k sampled completions scores >= 1 on that reward.
Prompts go through the sampler in fixed-size batches (the last one padded by repetition), so evaluation
compiles one sampler program however many prompts there are.
"""
from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from grpo_jax.sampling.episodes import EpisodeResult
from grpo_jax.train.rollout import Scoring, encode_prompts, episode_metrics, grade, repeat_columns


def _generate_all(sampler, params, prompt_ids: list[list[int]], batch_size: int, key, repeats: int = 1,
                  on_batch: Callable[[int, int], None] | None = None):
  """The sampler's result for every prompt, `repeats` per prompt (rows of a prompt contiguous), batch by batch
  of `batch_size` prompts, `on_batch(done, total)` after each; padded rows are dropped."""
  outs = []
  starts = range(0, len(prompt_ids), batch_size)
  for i, start in enumerate(starts):
    chunk = prompt_ids[start:start + batch_size]
    real = len(chunk) * repeats
    chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))
    out = sampler.generate(params, chunk, jax.random.fold_in(key, i), repeats=repeats)
    outs.append(type(out)(*[x[:real] for x in out]))
    if on_batch is not None:
      on_batch(i + 1, len(starts))
  return type(outs[0])(*[np.concatenate(xs) for xs in zip(*outs)])


def evaluate(greedy_sampler, params, tokenizer, columns: dict[str, list], scoring: Scoring, *,
             accuracy_reward: str, batch_size: int, max_prompt_length: int, key, pass_k: int = 0,
             pass_k_sampler=None, return_details: bool = False,
             on_batch: Callable[[int, int], None] | None = None) -> dict:
  """Metrics 'eval/accuracy', 'eval/reward', 'eval/mean_length' and, with pass_k > 0, 'eval/pass@k'.

  With `return_details`, (metrics, details): details["completions"] (the greedy texts), ["accuracy"] (each
  prompt's accuracy reward) and ["finished"] (bool: a stop token came within max_new_tokens). `on_batch(done,
  total)` is called after each sampler batch of the greedy pass (grpo-evaluate's progress lines)."""
  texts = list(columns["prompt"])
  prompt_ids = encode_prompts(tokenizer, texts, max_prompt_length)
  other = {k: v for k, v in columns.items() if k != "prompt"}
  out = _generate_all(greedy_sampler, params, prompt_ids, batch_size, key, on_batch=on_batch)
  result, completions, _ = grade(tokenizer, out, texts, other, scoring)
  accuracy = np.asarray(result.per_fn[accuracy_reward])
  metrics = {"eval/accuracy": float(np.mean(accuracy)),
             "eval/full_credit": float(np.mean(accuracy >= 1.0)),
             "eval/reward": float(np.mean(result.total)),
             "eval/mean_length": float(np.mean(out.lengths_B))}
  if isinstance(out, EpisodeResult):
    metrics.update(episode_metrics(out, prefix="eval/episodes/"))
  if pass_k > 0:
    if pass_k_sampler is None:
      raise ValueError("pass_k > 0 needs pass_k_sampler (a sampler at the pass@k temperature)")
    out_k = _generate_all(pass_k_sampler, params, prompt_ids, batch_size, jax.random.fold_in(key, 1_000_003),
                          repeats=pass_k)
    texts_k = [t for t in texts for _ in range(pass_k)]
    result_k, _, _ = grade(tokenizer, out_k, texts_k, repeat_columns(other, pass_k), scoring)
    acc_k = np.asarray(result_k.per_fn[accuracy_reward]).reshape(-1, pass_k)
    metrics[f"eval/pass@{pass_k}"] = float(np.mean(np.any(acc_k >= 1.0, axis=1)))
  if return_details:
    return metrics, {"completions": completions, "accuracy": accuracy,
                     "finished": ~np.asarray(out.truncated_B, bool)}
  return metrics
