"""The `reasoning_gym` reward: a reasoning-gym task's own verifier (grpo_jax/data/reasoning_gym.py), and the
import of the optional package that both use (`import_gym`).

The answer is what reasoning-gym's `extract_answer` takes: the content of the LAST complete <answer> </answer>
pair, stripped of surrounding whitespace (found with a linear scan, `answers.answer_tag_content`, where
reasoning-gym's regular expression is quadratic on many unclosed tags); a completion without one gives the
verifier None, which every dataset scores 0. The score is the dataset's `score_answer(answer, entry)` in [0, 1]
(some datasets give partial credit), from a dataset built with the row's options (`gym_source`), so that
options that change the verifier (tolerances, formats) are honoured, and composites score each item with the
dataset it came from.

In answer-only mode (rows with `gym_answer_only`, grpo_jax/data/reasoning_gym.py) the prompt ended in "<answer>":
the answer is the first non-empty line of the completion's text before its first "</" (where "</answer>"
starts), stripped, its first sentence (up to ". "), without a leading "The answer is" / "Answer:", the right-hand
side of its last "=" when it has one ("q = 14" and "4 + 5 = 9" answer their value: without this, the default
verifier's partial credit for a line that contains the answer, len(answer) / len(line), paid " = 6" a third and
a policy settled there), without a trailing period and quotes around it (what a small chat model writes after
"<answer>"); None when there is no such line).

Like every reward it runs in the reward worker process by default (grpo_jax/rewards/isolation.py): a verifier
that raises or hangs on a completion scores `reward_fallback` there and is counted in `rewards/<name>/failures`,
never stopping the run. A verifier that prints (bf) prints to the worker's stderr.
"""
from __future__ import annotations

import json
import re

from grpo_jax.errors import ConfigError
from grpo_jax.rewards.answers import answer_tag_content
from grpo_jax.rewards.registry import register_answer_key, register_reward

VERSION = "0.1.25"
INSTALL_HINT = f"pip install -e '.[gym]' (or pip install reasoning-gym=={VERSION})"
_SCORERS: dict[str, object] = {}   # gym_source -> dataset, built once per process


class GymError(ConfigError):
  """A reasoning-gym task that cannot be built as configured; the message names the config key and the fix."""


def import_gym():
  """The reasoning_gym module, or a one-line GymError naming the extra to install."""
  try:
    import reasoning_gym  # pylint: disable=import-outside-toplevel  (an optional extra)
  except ImportError:
    raise GymError(f"config.task.name: reasoning_gym tasks need the optional package reasoning-gym: "
                   f"{INSTALL_HINT}") from None
  return reasoning_gym


def extract_answer(completion: str) -> str | None:
  """The stripped content of the last complete <answer> </answer> pair, or None (reasoning-gym's rule)."""
  content = answer_tag_content(completion)
  return None if content is None else content.strip()


def extract_answer_only(completion: str) -> str | None:
  """Answer-only mode: the first non-empty line before the completion's first "</", stripped; None if none."""
  lines = [line.strip() for line in completion.split("</", 1)[0].splitlines()]
  line = next((line for line in lines if line), None)
  if line is None:
    return None
  line = re.sub(r"^(the (final )?answer is:?|answer:)\s*", "", line, flags=re.IGNORECASE)
  line = re.split(r"\.\s", line, maxsplit=1)[0]   # its first sentence
  if "=" in line:  # "q = 14", "4 + 5 = 9", "= 6": the value the line arrives at
    line = line.rsplit("=", 1)[1].strip()
  line = line[:-1].strip() if line.endswith(".") else line
  if not line:
    return None
  return line[1:-1] if len(line) > 1 and line[0] == line[-1] and line[0] in "\"'" else line


def _dataset(source: str):
  dataset = _SCORERS.get(source)
  if dataset is None:
    spec = json.loads(source)
    dataset = import_gym().create_dataset(spec["name"], **spec["options"])
    _SCORERS[source] = dataset
  return dataset


def score_answer(answer: str | None, entry: dict, source: str) -> float:
  """The dataset's own score of an answer (already extracted) to the item `entry` of the row's `gym_source`."""
  return float(_dataset(source).score_answer(answer, entry))


def score(completion: str, entry: dict, source: str, answer_only: bool = False) -> float:
  """The dataset's own score of the completion's answer."""
  return score_answer(extract_answer_only(completion) if answer_only else extract_answer(completion), entry, source)


@register_reward("reasoning_gym")
def reasoning_gym_score(prompts: list[str], completions: list[str], gym_entry: list, gym_source: list,
                        gym_answer_only: list | None = None, **unused_columns) -> list[float]:
  """Each completion scored by its row's reasoning-gym verifier (columns `gym_entry`, `gym_source`, and
  `gym_answer_only`)."""
  del prompts, unused_columns
  answer_only = gym_answer_only or [False] * len(completions)
  return [score(c, e, s, bool(a)) for c, e, s, a in zip(completions, gym_entry, gym_source, answer_only,
                                                         strict=True)]


@register_reward("reasoning_gym_full_credit")
def reasoning_gym_full_credit(prompts: list[str], completions: list[str], **columns) -> list[float]:
  """1 where the row's verifier gives full credit, else 0: `reasoning_gym` without partial credit. Most datasets
  keep reasoning-gym's default verifier, which pays len(answer) / len(line) for a line that contains the answer;
  a policy learns to exploit it (two-digit guesses at one-digit answers, each paid half), so the presets of
  experiments/gym.py train and evaluate on full credit alone (docs/gym.md)."""
  return [float(s >= 1.0) for s in reasoning_gym_score(prompts, completions, **columns)]


@register_answer_key("reasoning_gym")
@register_answer_key("reasoning_gym_full_credit")
def gym_answer_key(completion: str) -> str | None:
  """The <answer> tag's content, else (an answer-only row) the answer line."""
  answer = extract_answer(completion)
  return answer if answer is not None else extract_answer_only(completion)
