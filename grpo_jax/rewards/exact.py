"""The simplest verifier: the whole completion must equal the answer (synthetic tasks)."""
from __future__ import annotations

from grpo_jax.rewards.registry import register_reward


@register_reward("exact_match")
def exact_match(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  """1.0 if `completion.strip() == str(answer).strip()`, else 0.0."""
  del prompts, unused_columns
  return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


@register_reward("final_field_match")
def final_field_match(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  """1.0 if the completion's last comma-separated field equals the answer ("11,13,22" and "22" score for 22;
  the chain_sum task), else 0.0."""
  del prompts, unused_columns
  return [float(c.split(",")[-1].strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]
