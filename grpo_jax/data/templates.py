"""Prompt templates and prompt-length filtering.

Templates (the `template` argument of `render_prompt`):
  "plain":   the question text as is.
  "r1_zero": our wording of DeepSeek-R1-Zero's plain-text template (a User/Assistant transcript that asks for
             the reasoning in <think> </think> and the answer in <answer> </answer>), for base models. With
             `prefill_think=True` the prompt ends in "<think>", so completions start inside the think block
             (score them with the `format_*_prefilled` rewards).
  "chat":    the tokenizer's own chat template, with an optional system prompt, rendered with
             `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`, for instruct models.
"""
from __future__ import annotations

from typing import Any, Sequence

R1_ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The User asks a question and the Assistant solves it. "
    "The Assistant first thinks through the reasoning process in its mind and then gives the User the answer. "
    "The reasoning is enclosed in <think> </think> tags and the answer in <answer> </answer> tags, that is: "
    "<think> reasoning process here </think> <answer> answer here </answer>.\n"
    "User: {question}\n"
    "Assistant:")

# A system prompt that asks an instruct model for the same layout (for the "chat" template).
R1_SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think through the reasoning process in your mind and then give "
    "the user the answer. Enclose the reasoning in <think> </think> tags and the answer in <answer> </answer> "
    "tags, that is: <think> reasoning process here </think> <answer> answer here </answer>.")

TEMPLATES = ("plain", "r1_zero", "chat")


def render_prompt(question: str | list[dict], template: str = "plain", tokenizer: Any = None,
                  system_prompt: str | None = None, prefill_think: bool = False, prefill: str = "") -> str:
  """The text fed to the model for one question (templates in the module docstring), then `prefill` (the start
  of the answer written for the model, e.g. "<answer>" in reasoning_gym's answer-only mode).

  `question` may be a list of chat messages (TRL's conversational form): the "chat" template renders them as
  they are, after `system_prompt` unless they hold a system message of their own.
  """
  conversational = isinstance(question, (list, tuple))
  if conversational and template != "chat":
    raise ValueError(f"a prompt given as chat messages needs the 'chat' template (config.task.template), not "
                     f"{template!r}")
  if prefill:
    return render_prompt(question, template, tokenizer, system_prompt, prefill_think) + prefill
  if template == "plain":
    return question
  if template == "r1_zero":
    text = R1_ZERO_TEMPLATE.format(question=question)
    return text + " <think>" if prefill_think else text
  if template == "chat":
    if tokenizer is None:
      raise ValueError("the 'chat' template needs a tokenizer")
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat_template; use template='plain' or "
                       "'r1_zero', or set tokenizer.chat_template")
    turns = list(question) if conversational else [{"role": "user", "content": question}]
    has_system = any(m["role"] == "system" for m in turns)
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt and not has_system else []) + turns
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text + "<think>" if prefill_think else text
  raise ValueError(f"unknown template {template!r}; expected one of {TEMPLATES}")


def tokenize_prompts(rows: Sequence[dict], tokenizer: Any, max_prompt_tokens: int, template: str = "plain",
                     system_prompt: str | None = None, prefill_think: bool = False,
                     add_special_tokens: bool | None = None, prefill: str = "") -> tuple[list[dict], int]:
  """Renders each row's `prompt` with the template, tokenizes it, and drops prompts over the limit.

  Returns (kept rows, number dropped). Kept rows are copies with `prompt_text` (the rendered string) and
  `prompt_ids` (list[int]) added, in their original order. `add_special_tokens` defaults to False for the
  chat template (its text already holds the special tokens) and True otherwise (so a BOS is added for models
  whose tokenizer adds one). The caller logs the dropped count.
  """
  if max_prompt_tokens <= 0:
    raise ValueError(f"max_prompt_tokens must be positive, got {max_prompt_tokens}")
  if add_special_tokens is None:
    add_special_tokens = template != "chat"
  texts = [render_prompt(row["prompt"], template, tokenizer, system_prompt, prefill_think, prefill)
           for row in rows]
  if not texts:
    return [], 0
  ids = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
  kept = [dict(row, prompt_text=text, prompt_ids=list(row_ids))
          for row, text, row_ids in zip(rows, texts, ids) if len(row_ids) <= max_prompt_tokens]
  return kept, len(rows) - len(kept)


# Gemma 3's chat template (text turns), as in the instruction-tuned google/gemma-3-*-it tokenizers: a BOS, a
# system message folded into the first user turn, roles user / model, each turn
# "<start_of_turn>{role}\n{content}<end_of_turn>\n". `scripts/get_gemma3.py` gives it to the 270M base
# model's tokenizer, whose GGUF carries none.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\\n' }}"
    "{%- endif -%}")
