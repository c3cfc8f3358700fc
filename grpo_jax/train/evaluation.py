"""Held-out evaluation: the figures of eval_figures.py (greedy accuracy and full credit; with `samples` = N > 0,
N completions per prompt at the evaluation's temperature give avg@N, pass@k, maj@k), each with its 95% interval
over prompts (Wilson for a 0/1 score per prompt, else a BCa bootstrap over prompts with a prompt's N samples kept
together; grpo_jax/stats/intervals.py). Full credit is lower than accuracy where a verifier gives partial credit,
as reasoning-gym's default one does for an answer inside a longer line.
Prompts go through the sampler in fixed-size batches (the last one padded by repetition), so evaluation
compiles one sampler program however many prompts there are. `RunEvaluation` is a training run's: its held-out
and transfer sets, fixed once.
"""
from __future__ import annotations

import json
import time
from typing import Callable, Sequence

import jax
import numpy as np

from grpo_jax import compile_cache, storage
from grpo_jax.data import tasks
from grpo_jax.rewards.registry import answer_key
from grpo_jax.sampling.episodes import EpisodeResult
from grpo_jax.train.eval_figures import asked, computed
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
    outs.append(type(out)(*[None if x is None else x[:real] for x in out]))
    if on_batch is not None:
      on_batch(i + 1, len(starts))
  return type(outs[0])(*[None if xs[0] is None else np.concatenate(xs) for xs in zip(*outs)])


def _jsonable(answer):
  return None if answer is None else answer if isinstance(answer, (str, int, float, bool)) else str(answer)


def evaluate(greedy_sampler, params, tokenizer, columns: dict[str, list], scoring: Scoring, *,
             accuracy_reward: str, batch_size: int, max_prompt_length: int, key, samples: int = 0,
             ks: dict | None = None, sampler=None, return_details: bool = False,
             sample_completions: bool = False, on_batch: Callable[[int, int], None] | None = None) -> dict:
  """Metrics 'eval/reward', 'eval/mean_length' and the greedy figures ('eval/accuracy', 'eval/full_credit', each
  with /lo and /hi); with `samples` = N > 0 (drawn by `sampler`), the sampled ones at the k's that `ks` asks for
  (eval_figures.asked: {"pass_k": (1, 4), ...}).

  With `return_details`, (metrics, details): details["completions"] (the greedy texts), ["accuracy"] (each
  prompt's accuracy reward), ["finished"] (bool: a stop token came within max_new_tokens), ["methods"] (each
  figure's interval method: wilson or bca) and ["rows"] (one
  dict per prompt: its greedy and sampled answers, rewards and correctness, `sample_completions` adding the
  sampled texts; `prompt_rows`). `on_batch(done, total)` is called after each sampler batch of the greedy pass
  (grpo-evaluate's progress lines)."""
  texts = list(columns["prompt"])
  prompt_ids = encode_prompts(tokenizer, texts, max_prompt_length)
  other = {k: v for k, v in columns.items() if k != "prompt"}
  key_of = answer_key(accuracy_reward)
  out = _generate_all(greedy_sampler, params, prompt_ids, batch_size, key, on_batch=on_batch)
  result, completions, _ = grade(tokenizer, out, texts, other, scoring)
  accuracy = np.asarray(result.per_fn[accuracy_reward], np.float64)
  methods: dict[str, str] = {}
  metrics = {**computed(accuracy[:, None], [[key_of(c)] for c in completions], greedy=True, methods=methods),
             "eval/reward": float(np.mean(result.total)),
             "eval/mean_length": float(np.mean(out.lengths_B))}
  if isinstance(out, EpisodeResult):
    metrics.update(episode_metrics(out, prefix="eval/episodes/"))
  sampled = None
  if samples > 0:
    if sampler is None:
      raise ValueError("samples > 0 needs a sampler (at the evaluation's temperature)")
    out_n = _generate_all(sampler, params, prompt_ids, batch_size, jax.random.fold_in(key, 1_000_003),
                          repeats=samples)
    texts_n = [t for t in texts for _ in range(samples)]
    result_n, completions_n, _ = grade(tokenizer, out_n, texts_n, repeat_columns(other, samples), scoring)
    scores_PxN = np.asarray(result_n.per_fn[accuracy_reward], np.float64).reshape(-1, samples)
    answers = [key_of(c) for c in completions_n]
    answers_PxN = [answers[i:i + samples] for i in range(0, len(answers), samples)]
    metrics.update(computed(scores_PxN, answers_PxN, greedy=False, ks=ks, methods=methods))
    sampled = (scores_PxN, answers_PxN, [completions_n[i:i + samples] for i in range(0, len(answers), samples)])
  if return_details:
    rows = prompt_rows(texts, other.get("answer"), completions, accuracy, key_of, sampled, sample_completions)
    return metrics, {"completions": completions, "accuracy": accuracy,
                     "finished": ~np.asarray(out.truncated_B, bool), "rows": rows, "methods": methods}
  return metrics


def prompt_rows(prompts: Sequence[str], gold: Sequence | None, completions: Sequence[str], accuracy: np.ndarray,
                key_of, sampled=None, sample_completions: bool = False) -> list[dict]:
  """One JSON-able row per prompt, from which every figure can be recomputed:
  {"prompt", "gold", "greedy": {"completion", "answer", "reward", "correct"},
   "samples": [{"answer", "reward", "correct"[, "completion"]}, ...]} (samples only with N > 0)."""
  rows = []
  for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
    row = {"prompt": prompt, "gold": None if gold is None else _jsonable(gold[i]),
           "greedy": {"completion": completion, "answer": _jsonable(key_of(completion)),
                      "reward": float(accuracy[i]), "correct": bool(accuracy[i] >= 1.0)}}
    if sampled is not None:
      scores_PxN, answers_PxN, texts_PxN = sampled
      row["samples"] = [{"answer": _jsonable(a), "reward": float(r), "correct": bool(r >= 1.0),
                         **({"completion": t} if sample_completions else {})}
                        for a, r, t in zip(answers_PxN[i], scores_PxN[i], texts_PxN[i], strict=True)]
    rows.append(row)
  return rows


def write_rows(path: str, rows: Sequence[dict]) -> None:
  """The rows as JSON lines at `path` (a local path or a gs:// / s3:// URL), written whole and atomically (a kill
  during an evaluation leaves no half file for grpo-report to read)."""
  storage.write_text(path, "".join(json.dumps(row) + "\n" for row in rows), atomic=True)


def figures_of_rows(rows: Sequence[dict], **ks: Sequence[int]) -> dict:
  """The figures of `evaluate` recomputed from its rows (what a reader of a --out file can do): the greedy ones,
  and the sampled ones at the k's of `ks` (pass_k=(1, 4), ...) when the rows have samples."""
  figures = computed([[r["greedy"]["reward"]] for r in rows], [[r["greedy"]["answer"]] for r in rows], greedy=True)
  if rows and rows[0].get("samples"):
    figures.update(computed([[s["reward"] for s in r["samples"]] for r in rows],
                            [[s["answer"] for s in r["samples"]] for r in rows], greedy=False, ks=ks))
  return figures


class RunEvaluation:
  """A training run's evaluation of its policy at a step: held-out metrics eval/*, and at the first and last step
  transfer/<name>/* for each of the task's transfer sets (built once: the rows, the task's step-0 baselines).
  Each evaluation's seconds go to `seconds[step]` (the loop logs them as timing/eval_s), not into the metrics,
  which checkpoints and the warm start's log keep."""

  def __init__(self, settings, task, tokenizer, greedy_sampler, sampler, scoring: Scoring, base_key, log,
               time_split):
    self.settings, self.tokenizer, self.scoring, self.base_key = settings, tokenizer, scoring, base_key
    self.greedy_sampler, self.sampler = greedy_sampler, sampler
    self.log, self.time_split = log, time_split
    self.columns = task.eval_rows(settings.eval.size)
    # what one constant answer scores (the task's plug-in), logged at step 0: the floor to read accuracy against
    best = tasks.constant_answer(settings, self.columns)
    self.baselines = {} if best is None else {tasks.CONSTANT_ANSWER_METRIC: best[1]}
    self.transfer_columns = {name: task.transfer_rows(name, settings.eval.size)
                             for name in getattr(task, "transfer_sets", ())}
    self.seconds: dict[int, float] = {}
    self.rows_path: Callable[[int], str] | None = None  # step -> where its held-out rows go (the main process's)

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
    metrics, details = evaluate(self.greedy_sampler, params, self.tokenizer, self.columns, self.scoring,
                                samples=e.samples, ks=asked(e), sampler=self.sampler, return_details=True, **kwargs)
    if self.rows_path is not None:
      write_rows(self.rows_path(step), details["rows"])
    if step == 0:
      metrics.update(self.baselines)
    if step in (0, num_steps):
      for name, columns in self.transfer_columns.items():
        transfer = evaluate(self.greedy_sampler, params, self.tokenizer, columns, self.scoring, **kwargs)
        metrics.update({f"transfer/{name}/" + k.split("/", 1)[1]: v for k, v in transfer.items()})
    return metrics
