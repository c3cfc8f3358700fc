"""The simplest verifier: the whole completion must equal the answer (synthetic tasks)."""
from __future__ import annotations

from grpo_jax.rewards.registry import register_reward


@register_reward("exact_match")
def exact_match(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  """1.0 if `completion.strip() == str(answer).strip()`, else 0.0."""
  del prompts, unused_columns
  return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]
