"""One rollout: prompts -> sampler (G per prompt) -> decoded completions -> weighted rewards -> advantages.

Everything here runs on the host between jitted programs (the sampler and the update), on numpy arrays.
Shapes: R prompts, G completions per prompt, B = R * G (groups contiguous), P prompt length, N completion
length (= max_new_tokens).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from grpo_jax.algo.advantages import compute_advantages, group_stats
from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.rewards.scoring import score_completions
from grpo_jax.train.step import RolloutBatch

RewardSpec = tuple[str, Callable, float]

# One small program each (eagerly, every jnp op would be its own compiled program).
_advantages = jax.jit(compute_advantages, static_argnums=(1, 2, 3, 4))
_group_stats = jax.jit(group_stats, static_argnums=(1, 2))


def encode_text(tokenizer, text: str) -> list[int]:
  """Token ids of a prompt (no special tokens added; the prompt text carries any template)."""
  if isinstance(tokenizer, CharTokenizer):
    return tokenizer.encode(text)
  return list(tokenizer.encode(text, add_special_tokens=False))


def decode_completion(tokenizer, ids_N: np.ndarray, mask_N: np.ndarray) -> str:
  """The completion's text: its real tokens, without the stop token."""
  ids = [int(t) for t, m in zip(ids_N, mask_N) if m]
  if ids and ids[-1] == tokenizer.eos_token_id:
    ids = ids[:-1]
  if isinstance(tokenizer, CharTokenizer):
    return tokenizer.decode(ids)
  return tokenizer.decode(ids, skip_special_tokens=True)


def encode_prompts(tokenizer, prompts: Sequence[str], max_prompt_length: int) -> list[list[int]]:
  out = []
  for text in prompts:
    ids = encode_text(tokenizer, text)
    if not ids:
      raise ValueError(f"prompt {text!r} encodes to no tokens")
    if len(ids) > max_prompt_length:
      raise ValueError(f"prompt {text[:80]!r} has {len(ids)} tokens, more than "
                       f"config.sampling.max_prompt_length={max_prompt_length}")
    out.append(ids)
  return out


def repeat_columns(columns: dict[str, list], times: int) -> dict[str, list]:
  """Each row repeated `times` times in place (the layout of groups)."""
  return {k: [v for v in vals for _ in range(times)] for k, vals in columns.items()}


def score(reward_fns: Sequence[RewardSpec], prompts: list[str], completions: list[str],
          columns: dict[str, list], timeout_s: float, fallback: float):
  return score_completions(list(reward_fns), prompts, completions, columns, timeout_s=timeout_s,
                           fallback=fallback)


class Rollout(NamedTuple):
  batch: RolloutBatch     # numpy arrays, ready for the update (ref_logp_BxN still None)
  metrics: dict[str, float]
  prompts: list[str]      # [B]
  completions: list[str]  # [B]
  rewards_B: np.ndarray
  num_tokens: int         # real prompt + completion tokens


def collect_rollout(sampler, params, tokenizer, columns: dict[str, list], *, group_size: int, key,
                    reward_fns: Sequence[RewardSpec], max_prompt_length: int, advantage: str, std_ddof: int,
                    advantage_eps: float, mask_truncated: bool, reward_timeout_s: float,
                    reward_fallback: float) -> Rollout:
  """Samples G completions for each of the R prompts in `columns["prompt"]`, scores them, and builds the batch.

  Metrics (ALGORITHMS.md §8 names): reward, reward_std (mean within-group std), rewards/<fn>/mean and /std,
  frac_reward_zero_std, completions/{mean,min,max}_length, completions/clipped_ratio, and
  rewards/<fn>/failures when a reward function failed on some samples.
  """
  G = group_size
  texts = list(columns["prompt"])
  prompt_ids = encode_prompts(tokenizer, texts, max_prompt_length)
  prompt_ids_B = [ids for ids in prompt_ids for _ in range(G)]
  out = sampler.generate(params, prompt_ids_B, key)

  prompts_B = [t for t in texts for _ in range(G)]
  completions_B = [decode_completion(tokenizer, c, m) for c, m in zip(out.completion_BxN, out.completion_mask_BxN)]
  cols_B = repeat_columns({k: v for k, v in columns.items() if k != "prompt"}, G)
  cols_B["completion_length"] = out.lengths_B.tolist()
  result = score(reward_fns, prompts_B, completions_B, cols_B, reward_timeout_s, reward_fallback)
  rewards_B = np.asarray(result.total, np.float32)
  advantages_B = np.asarray(_advantages(rewards_B, G, advantage, std_ddof, float(advantage_eps)))
  stats = jax.device_get(_group_stats(rewards_B, G, std_ddof))

  loss_mask_BxN = out.completion_mask_BxN.astype(np.int32)
  if mask_truncated:  # DAPO overlong filtering: truncated completions contribute no loss.
    loss_mask_BxN = loss_mask_BxN * (~out.truncated_B)[:, None].astype(np.int32)
  batch = RolloutBatch(
      prompt_BxP=out.prompt_BxP.astype(np.int32), prompt_mask_BxP=out.prompt_mask_BxP.astype(np.int32),
      completion_BxN=out.completion_BxN.astype(np.int32), completion_mask_BxN=loss_mask_BxN,
      advantages_B=advantages_B.astype(np.float32), sampler_logp_BxN=out.logp_BxN.astype(np.float32),
      ref_logp_BxN=None)

  lengths = out.lengths_B.astype(np.float64)
  metrics: dict[str, Any] = {
      "reward": float(rewards_B.mean()),
      "reward_std": float(np.mean(stats.std_P)),
      "frac_reward_zero_std": float(np.mean(stats.zero_std_P)),
      "completions/mean_length": float(lengths.mean()),
      "completions/min_length": float(lengths.min()),
      "completions/max_length": float(lengths.max()),
      "completions/clipped_ratio": float(np.mean(out.truncated_B)),
  }
  for name, values in result.per_fn.items():
    metrics[f"rewards/{name}/mean"] = float(np.mean(values))
    metrics[f"rewards/{name}/std"] = float(np.std(values))
    if result.failures.get(name):
      metrics[f"rewards/{name}/failures"] = int(result.failures[name])
  num_tokens = int(out.prompt_mask_BxP.sum() + out.completion_mask_BxN.sum())
  return Rollout(batch, metrics, prompts_B, completions_B, rewards_B, num_tokens)
