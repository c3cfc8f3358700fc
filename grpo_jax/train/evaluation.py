"""Held-out evaluation: greedy accuracy and mean reward, and pass@k when configured.

accuracy = mean over held-out prompts of the accuracy reward (e.g. exact_match, 0/1) of the greedy completion;
full_credit = the share of them whose accuracy reward is >= 1 (the same for a 0/1 reward; lower where a verifier
gives partial credit, as reasoning-gym's default one does for an answer inside a longer line).
pass@k = fraction of prompts for which at least one of k sampled completions scores >= 1 on that reward.
Prompts go through the sampler in fixed-size batches (the last one padded by repetition), so evaluation
compiles one sampler program however many prompts there are. `RunEvaluation` is a training run's: its held-out
and transfer sets, fixed once.
"""
from __future__ import annotations

import time
from typing import Callable

import jax
import numpy as np

from grpo_jax import compile_cache
from grpo_jax.data import tasks
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


class RunEvaluation:
  """A training run's evaluation of its policy at a step: held-out metrics eval/*, and at the first and last step
  transfer/<name>/* for each of the task's transfer sets (built once: the rows, the task's step-0 baselines).
  Each evaluation's seconds go to `seconds[step]` (the loop logs them as timing/eval_s), not into the metrics,
  which checkpoints and the warm start's log keep."""

  def __init__(self, settings, task, tokenizer, greedy_sampler, pass_k_sampler, scoring: Scoring, base_key, log,
               time_split):
    self.settings, self.tokenizer, self.scoring, self.base_key = settings, tokenizer, scoring, base_key
    self.greedy_sampler, self.pass_k_sampler = greedy_sampler, pass_k_sampler
    self.log, self.time_split = log, time_split
    self.columns = task.eval_rows(settings.eval.size)
    # the task's step-0 metrics, e.g. what one constant answer scores: the floor to read accuracy against
    self.baselines = tasks.eval_baselines(settings, self.columns)
    self.transfer_columns = {name: task.transfer_rows(name, settings.eval.size)
                             for name in getattr(task, "transfer_sets", ())}
    self.seconds: dict[int, float] = {}

  def __call__(self, params, step: int) -> dict:
    t0 = time.perf_counter()
    first = not self.seconds and step == 0  # the one evaluation before any progress line: say what it does
    if first:
      self.log(f"[eval] step 0: greedy completions of {len(self.columns['prompt'])} held-out prompts (the first "
               "call compiles the sampler) ...")
    with self.time_split.phase("eval"), compile_cache.CompileCounter() as compiled:
      metrics = self._metrics(params, step)
    self.seconds[step] = time.perf_counter() - t0
    if first:
      self.log(f"[eval] step 0: held-out accuracy {metrics['eval/accuracy']:.3f} in {self.seconds[step]:.1f} s "
               f"({compiled.describe()})")
    return metrics

  def _metrics(self, params, step: int) -> dict:
    e, num_steps = self.settings.eval, self.settings.num_steps
    kwargs = dict(accuracy_reward=e.accuracy_reward, max_prompt_length=self.settings.sampling.max_prompt_length,
                  batch_size=min(e.batch_size, e.size), key=jax.random.fold_in(self.base_key, 10_000_000 + step))
    metrics = evaluate(self.greedy_sampler, params, self.tokenizer, self.columns, self.scoring, pass_k=e.pass_k,
                       pass_k_sampler=self.pass_k_sampler, **kwargs)
    if step == 0:
      metrics.update(self.baselines)
    if step in (0, num_steps):
      for name, columns in self.transfer_columns.items():
        transfer = evaluate(self.greedy_sampler, params, self.tokenizer, columns, self.scoring, **kwargs)
        metrics.update({f"transfer/{name}/" + k.split("/", 1)[1]: v for k, v in transfer.items()})
    return metrics
