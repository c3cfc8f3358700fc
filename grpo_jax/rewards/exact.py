"""The simplest verifier: the whole completion must equal the answer (synthetic tasks)."""
from __future__ import annotations

from grpo_jax.rewards.registry import register_answer_key, register_reward, whole_completion


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


@register_reward("first_line_match")
def first_line_match(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  """1.0 if the completion's first line, stripped, equals the answer (" 82\n45 + 13 = 58" scores for 82: a base
  model continuing a few-shot list goes on with the next line; word_arithmetic's few_shot style), else 0.0."""
  del prompts, unused_columns
  return [float(c.split("\n", 1)[0].strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


register_answer_key("exact_match")(whole_completion)
register_answer_key("final_field_match")(lambda completion: completion.split(",")[-1].strip() or None)
register_answer_key("first_line_match")(lambda completion: completion.split("\n", 1)[0].strip() or None)
