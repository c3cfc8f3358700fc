"""Sums asked in English, for instruct models: "What is 37 + 45?" -> a completion whose answer is 82; or, for
base models (the "plain" template), as a few-shot list of equations to continue: "...\n37 + 45 =" -> " 82".

Rows are GSM8K-layout dicts (`prompt`: the question; `answer`: the sum as a string), so `DatasetTask` renders
them with the chat template and `gsm8k_accuracy` scores them (the number in <answer>, after ####, in \\boxed{},
else the last number of the completion).

Training and held-out problems: ordered pairs (a, b) of `num_digits`-digit numbers (10..99 for 2 digits,
8,100 pairs). A fixed hash of the pair, the same for every seed, puts `heldout_fraction` of the pairs in the
held-out set; the training rows are the other pairs, so no held-out problem is ever trained on (nor its
mirror image b + a, which is kept on the same side of the split). Held-out problems are listed in a fixed,
shuffled order.

Styles: "question" (the chat template: the English question) and "few_shot" (the plain template: FEW_SHOT,
three solved sums, one a line, then the problem's "a + b =", which a base model continues; score the first
line of the completion with the `first_line_match` reward). The few-shot examples are training pairs.

Transfer sets (evaluated, never trained on), by name:
  "three_digit"  the same question with (num_digits + 1)-digit operands: does the skill carry to longer sums?
  "reworded"     the held-out pairs asked in other words ("Add 37 and 45.", "Tom has 37 marbles ..."): did
                 the model learn the arithmetic, or one phrasing?
"""
from __future__ import annotations

import numpy as np

from grpo_jax.config_checks import Section, fail
from grpo_jax.data.synthetic import _hash
from grpo_jax.data.tasks import RENDER_KEYS, DatasetTask, needs_tokenizer, register_task, transfer_names

TRANSFER_SETS = ("three_digit", "reworded")
_SPLIT, _ORDER, _PHRASE = 11, 12, 13   # hash stream ids.
_REWORDED = (
    "Add {a} and {b}.",
    "What do you get when you add {a} to {b}?",
    "Compute the sum of {a} and {b}.",
    "Tom has {a} marbles and gets {b} more. How many now?",
    "{a} apples plus {b} apples is how many apples?",
)


STYLES = ("question", "few_shot")
FEW_SHOT = "23 + 41 = 64\n58 + 17 = 75\n36 + 85 = 121\n"  # training pairs (tests/data)


def question(a: int, b: int, style: str = "question") -> str:
  if style == "question":
    return f"What is {a} + {b}?"
  if style == "few_shot":
    return f"{FEW_SHOT}{a} + {b} ="
  raise ValueError(f"word_arithmetic: unknown style {style!r} (known: {', '.join(STYLES)})")


def _row(a: int, b: int, text: str) -> dict:
  return {"prompt": text, "answer": str(a + b), "a": int(a), "b": int(b)}


def _pairs(num_digits: int) -> tuple[np.ndarray, np.ndarray]:
  lo, hi = 10 ** (num_digits - 1), 10 ** num_digits
  a, b = np.meshgrid(np.arange(lo, hi), np.arange(lo, hi), indexing="ij")
  return a.ravel(), b.ravel()


def split(num_digits: int, heldout_fraction: float, style: str = "question") -> tuple[list[dict], list[dict]]:
  """(train rows, held-out rows) of all `num_digits`-digit pairs, in a fixed order (module docstring)."""
  if num_digits < 1:
    raise ValueError(f"word_arithmetic: num_digits must be >= 1, got {num_digits}")
  if not 0 < heldout_fraction < 1:
    raise ValueError(f"word_arithmetic: heldout_fraction must be in (0, 1), got {heldout_fraction}")
  a, b = _pairs(num_digits)
  # The unordered pair decides the side, so a + b and b + a are never split across it.
  u = _hash(_SPLIT, np.minimum(a, b), np.maximum(a, b)).astype(np.float64) / 2.0 ** 64
  order = np.argsort(_hash(_ORDER, a, b), kind="stable")
  heldout = [_row(a[i], b[i], question(a[i], b[i], style)) for i in order if u[i] < heldout_fraction]
  train = [_row(a[i], b[i], question(a[i], b[i], style)) for i in order if u[i] >= heldout_fraction]
  return train, heldout


def transfer_rows(name: str, num_digits: int, heldout_fraction: float, n: int,
                  style: str = "question") -> list[dict]:
  """The first `n` rows of the transfer set `name` (one of TRANSFER_SETS; "reworded" is English in any style)."""
  if name == "three_digit":
    a, b = _pairs(num_digits + 1)
    order = np.argsort(_hash(_ORDER, a, b), kind="stable")[:n]
    return [_row(a[i], b[i], question(a[i], b[i], style)) for i in order]
  if name == "reworded":
    _, heldout = split(num_digits, heldout_fraction)
    rows = []
    for row in heldout[:n]:
      k = int(_hash(_PHRASE, row["a"], row["b"]) % np.uint64(len(_REWORDED)))
      rows.append(_row(row["a"], row["b"], _REWORDED[k].format(a=row["a"], b=row["b"])))
    return rows
  raise ValueError(f"config.task.transfer: unknown transfer set {name!r} (known: {', '.join(TRANSFER_SETS)})")


# --- The task, a plug-in (grpo_jax/data/tasks.py) ---------------------------------------------------------------------

def _check(settings, in_memory_dataset: bool) -> None:
  del in_memory_dataset
  if not settings.model.hf_path:
    fail("model.hf_path", "the word_arithmetic task needs a Hugging Face checkpoint directory (its tokenizer "
         "and chat template)", settings.model.hf_path)
  for name in transfer_names(settings):
    if name not in TRANSFER_SETS:
      Section(settings.task, "task").fail("transfer", f"{name!r} is not one of {list(TRANSFER_SETS)}")


@register_task("word_arithmetic", check=_check, takes=("num_digits", "heldout_fraction", "transfer", *RENDER_KEYS))
def _word_arithmetic(settings, tokenizer, log):
  t = settings.task
  needs_tokenizer("word_arithmetic", tokenizer, "its tokenizer and chat template")
  # The plain template (base models): few-shot equations to continue; otherwise the English question.
  style = "few_shot" if t.template == "plain" else "question"
  train, heldout = split(t.num_digits, t.heldout_fraction, style)
  transfer = {name: transfer_rows(name, t.num_digits, t.heldout_fraction, settings.eval.size, style)
              for name in transfer_names(settings)}
  task = DatasetTask(train, heldout, tokenizer, max_prompt_tokens=settings.sampling.max_prompt_length,
                     template=t.template, system_prompt=t.system_prompt, prefill_think=t.prefill_think,
                     seed=settings.seed, source="word_arithmetic", transfer=transfer)
  log(f"[data] word_arithmetic: {task.num_train} train / {task.num_heldout} held-out prompts"
      + (f", transfer sets {', '.join(task.transfer_sets)}" if task.transfer_sets else ""))
  return task
