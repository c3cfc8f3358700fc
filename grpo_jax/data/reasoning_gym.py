"""reasoning-gym datasets as tasks: `config.task.name = "reasoning_gym:<dataset>"` (optional extra `[gym]`).

reasoning-gym (PyPI `reasoning-gym`, Apache-2.0) generates about a hundred procedural datasets, each item a dict
{"question", "answer", "metadata"}, with a verifier `score_answer(answer, entry)` in [0, 1]. Here
  - `config.task.options` are the dataset's own options (the fields of its config dataclass, e.g.
    {"min_animals": 2} for leg_counting), passed through to `reasoning_gym.create_dataset`; an unknown option is
    an error naming the allowed ones. `seed` and `size` are ours (below), not options.
  - `reasoning_gym:composite` mixes datasets with weights: options {"datasets": {"leg_counting": {"weight": 2,
    "config": {...}}, "chain_sum": 1.0}} (a bare number is a weight with default options), or reasoning-gym's own
    list [{"name": ..., "weight": ..., "config": {...}}].
  - training items are items 0 .. task.train_size - 1 of the dataset seeded task.train_seed, held-out items
    0 .. task.heldout_size - 1 of the one seeded task.heldout_seed. reasoning-gym draws item i from
    Random(seed + i) (composites: seed + j + 1 for their j-th dataset), so two seeds closer than the sizes share
    items; `validate_config` asks for seeds at least train_size + heldout_size (+ datasets) apart. Small
    generators still repeat questions: held-out items whose question text is also a training question are
    dropped and counted (`Split.num_duplicates`, logged), so no held-out question is ever trained on.
  - each row is {"prompt": question, "answer": gold answer (str), "gym_entry": the item, "gym_source": JSON of the
    (sub-)dataset's name and options}; the `reasoning_gym` reward (grpo_jax/rewards/reasoning_gym.py) scores a
    completion with that dataset's own `score_answer`.
Answer-only mode (`config.task.answer_only`, what a small chat model needs: SmolLM2-135M-Instruct does not write
the tags by itself): the prompt ends in ANSWER_PREFILL ("<answer>") after the assistant turn's start, sampling
also stops at any token holding "</" (`closing_tag_ids`: the model closes the tag), and the reward scores the
first non-empty line of the completion before that "</" (rows carry `gym_answer_only`; grpo_jax/rewards/reasoning_gym.py).
Prompts are rendered like any dataset's (`tasks.DatasetTask`: config.task.template, config.task.system_prompt);
`SYSTEM_PROMPT` asks for the answer in <answer> </answer> tags, which is where the reward looks for it.
"""
from __future__ import annotations

import collections
import dataclasses
import difflib
import json
from typing import Any, Mapping, Sequence

import numpy as np

from grpo_jax.data.tasks import RENDER_KEYS, DatasetTask, needs_tokenizer, register_task, validate_rendered
from grpo_jax.rewards.reasoning_gym import INSTALL_HINT, VERSION, GymError, import_gym, score_answer  # noqa: F401

PREFIX = "reasoning_gym:"

# Our system prompt for the chat template (the layout of reasoning-gym's own default prompt, in our words).
SYSTEM_PROMPT = ("Solve the problem step by step. Then give the final answer alone between <answer> and </answer> "
                 "tags, for example <answer>42</answer>, in the format the question asks for.")

# Answer-only mode: the text that ends each prompt, and the system prompt that goes with it.
ANSWER_PREFILL = "<answer>"
ANSWER_ONLY_SYSTEM_PROMPT = ("Give only the final answer, on one line, in the format the question asks for, "
                             "then </answer>. No explanation.")


def dataset_name(task_name: str) -> str:
  """"reasoning_gym:leg_counting" -> "leg_counting"."""
  return task_name[len(PREFIX):]


def registry() -> dict[str, tuple[type, type]]:
  """reasoning-gym's datasets: name -> (dataset class, config dataclass)."""
  import_gym()
  from reasoning_gym.factory import DATASETS  # pylint: disable=import-outside-toplevel
  return DATASETS


def check_dataset(name: str, key: str = "config.task.name") -> None:
  """A GymError naming the closest dataset names (difflib) when `name` is not a reasoning-gym dataset."""
  known = registry()
  if name in known:
    return
  close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
  hint = f"did you mean {', '.join(PREFIX + c for c in close)}?" if close else f"known: {', '.join(sorted(known))}"
  raise GymError(f"{key}: {PREFIX + name!r} is not a reasoning-gym dataset; {hint}")


def _plain(value: Any) -> Any:
  """ConfigDicts and tuples as plain dicts and lists (what the dataset configs and JSON expect)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def _check_options(name: str, options: dict, key: str) -> None:
  """Each option must be a field of the dataset's config dataclass (and not seed/size); the config validates."""
  config_cls = registry()[name][1]
  fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
  for option in options:
    if option in ("seed", "size"):
      raise GymError(f"{key}.{option}: set config.task.train_seed / train_size / heldout_seed / heldout_size "
                     f"instead (training and held-out items must come from different seeds)")
    if option not in fields:
      close = difflib.get_close_matches(option, fields, n=1)
      raise GymError(f"{key}.{option}: not an option of {PREFIX}{name}"
                     f"{f' (did you mean {close[0]!r}?)' if close else ''}; its options: {', '.join(fields)}")
  try:
    config = config_cls(**options)
    if hasattr(config, "validate"):
      config.validate()
  except (AssertionError, ValueError, TypeError) as e:
    raise GymError(f"{key}: {PREFIX}{name} rejects {options} ({type(e).__name__}: {e})") from None


def components(task_name: str, options: Any) -> list[tuple[str, float, dict]]:
  """(dataset, weight, options) of each dataset of the task: one for a plain dataset, several for a composite.
  Checks the names and options (GymError naming the config key)."""
  name, options = dataset_name(task_name), _plain(options) or {}
  check_dataset(name)
  if name != "composite":
    _check_options(name, options, "config.task.options")
    return [(name, 1.0, options)]
  unknown = sorted(set(options) - {"datasets"})
  if unknown or "datasets" not in options:
    raise GymError("config.task.options: reasoning_gym:composite takes one option, datasets: {name: weight or "
                   f"{{'weight': w, 'config': {{...}}}}}} (got keys {sorted(options)})")
  specs = options["datasets"]
  if isinstance(specs, Mapping):
    specs = [dict(spec, name=n) if isinstance(spec, Mapping) else {"name": n, "weight": spec}
             for n, spec in specs.items()]
  if not isinstance(specs, list) or not specs:
    raise GymError("config.task.options.datasets: needs at least one dataset")
  out = []
  for spec in specs:
    sub = spec.get("name") if isinstance(spec, Mapping) else None
    key = f"config.task.options.datasets.{sub}"
    if not isinstance(sub, str) or set(spec) - {"name", "weight", "config"}:
      raise GymError(f"{key}: each dataset is {{'weight': w, 'config': {{...}}}}, got {spec!r}")
    check_dataset(sub, key)
    if sub == "composite":
      raise GymError(f"{key}: a composite cannot hold a composite")
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
      raise GymError(f"{key}.weight: must be a positive number, got {weight!r}")
    config = spec.get("config") or {}
    _check_options(sub, config, f"{key}.config")
    out.append((sub, float(weight), config))
  if len({c[0] for c in out}) != len(out):
    raise GymError("config.task.options.datasets: names a dataset twice")
  return out


def seed_distance(num_components: int, train_size: int, heldout_size: int) -> int:
  """How far apart the train and held-out seeds must be for their items to come from disjoint seeds."""
  return train_size + heldout_size + num_components + 1


def validate_config(settings) -> None:
  """The reasoning_gym checks of the run's settings (GymError naming the key), through the task's plug-in."""
  t = settings.task
  parts = components(t.name, t.options)
  for key in ("train_size", "heldout_size"):
    if getattr(t, key) < 1:
      raise GymError(f"config.task.{key}: must be >= 1, got {getattr(t, key)}")
  gap = seed_distance(len(parts), t.train_size, t.heldout_size)
  if abs(t.heldout_seed - t.train_seed) < gap:
    raise GymError(f"config.task.heldout_seed: {t.heldout_seed} is within {gap} of task.train_seed="
                   f"{t.train_seed}; reasoning-gym draws item i from seed + i, so the held-out items would repeat "
                   f"training items. Move it at least train_size + heldout_size + {len(parts) + 1} away")
  for key in ("train_seed", "heldout_seed"):
    if not 0 <= getattr(t, key) < 2 ** 31:
      raise GymError(f"config.task.{key}: must be in [0, 2**31), got {getattr(t, key)}")


def create(task_name: str, options: Any, seed: int, size: int):
  """The reasoning-gym dataset of the task (a CompositeDataset for a composite) with this seed and size."""
  gym = import_gym()
  parts = components(task_name, options)
  if dataset_name(task_name) != "composite":
    return gym.create_dataset(parts[0][0], seed=seed, size=size, **parts[0][2])
  from reasoning_gym.composite import DatasetSpec  # pylint: disable=import-outside-toplevel
  return gym.create_dataset("composite", seed=seed, size=size,
                            datasets=[DatasetSpec(name, weight, dict(config)) for name, weight, config in parts])


def closing_tag_ids(tokenizer) -> tuple[int, ...]:
  """Ids of the tokens whose text holds "</", the start of "</answer>" (answer-only mode stops at the first)."""
  size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
  texts = tokenizer.batch_decode([[i] for i in range(size)]) if hasattr(tokenizer, "batch_decode") else [
      tokenizer.decode([i]) for i in range(size)]
  return tuple(i for i, text in enumerate(texts) if "</" in text)


def source_key(name: str, options: dict) -> str:
  """The `gym_source` column: which dataset, with which options, scores the row (canonical JSON)."""
  return json.dumps({"name": name, "options": options}, sort_keys=True)


def rows(task_name: str, options: Any, seed: int, size: int, answer_only: bool = False) -> list[dict]:
  """Items 0 .. size-1 of the seeded dataset as task rows (module docstring)."""
  parts = {name: config for name, _, config in components(task_name, options)}
  dataset = create(task_name, options, seed, size)
  out = []
  for i in range(size):
    entry = dataset[i]
    source = entry.get("metadata", {}).get("source_dataset", dataset_name(task_name))
    answer = entry.get("answer")
    out.append({"prompt": entry["question"], "answer": "" if answer is None else str(answer), "gym_entry": entry,
                "gym_source": source_key(source, parts.get(source, {})), "gym_answer_only": bool(answer_only)})
  return out


@dataclasses.dataclass(frozen=True)
class Split:
  """Training rows, held-out rows, and how many held-out items were dropped as questions seen in training."""
  train: list[dict]
  heldout: list[dict]
  num_duplicates: int


def split(task_name: str, options: Any, *, train_seed: int, train_size: int, heldout_seed: int,
          heldout_size: int, answer_only: bool = False) -> Split:
  """The task's training and held-out rows, no held-out question among the training ones (module docstring)."""
  train = rows(task_name, options, train_seed, train_size, answer_only)
  seen = {row["prompt"] for row in train}
  heldout = rows(task_name, options, heldout_seed, heldout_size, answer_only)
  kept = [row for row in heldout if row["prompt"] not in seen]
  return Split(train=train, heldout=kept, num_duplicates=len(heldout) - len(kept))


FULL_CREDIT_REWARD = "reasoning_gym_full_credit"   # grpo_jax/rewards/reasoning_gym.py
CONSTANT_ANSWER_CANDIDATES = 20


def constant_answer(columns: Mapping[str, Sequence], full_credit: bool = False) -> tuple[str, float] | None:
  """(answer, mean score) of the best single answer for these rows: of their CONSTANT_ANSWER_CANDIDATES most
  frequent gold answers, the one that scores highest when given to every row, by each row's own verifier
  (partial credit counts, unless `full_credit`: then a score below 1 counts 0). What a policy that learned one
  constant answer would score on them: the floor to read a task's held-out accuracy against (docs/gym.md).
  None for rows that are not reasoning-gym rows."""
  if not {"gym_entry", "gym_source", "answer"} <= set(columns) or not columns["answer"]:
    return None

  def mean_score(answer: str) -> float:
    scores = []
    for entry, source in zip(columns["gym_entry"], columns["gym_source"], strict=True):
      try:
        value = score_answer(answer, entry, source)
        scores.append(float(value >= 1.0) if full_credit else value)
      except Exception:  # pylint: disable=broad-except  # a verifier that rejects another item's answer: 0
        scores.append(0.0)
    return float(np.mean(scores))

  frequent = [a for a, _ in collections.Counter(columns["answer"]).most_common(CONSTANT_ANSWER_CANDIDATES)]
  return max(((a, mean_score(a)) for a in frequent), key=lambda pair: pair[1])


# --- The task, a plug-in (grpo_jax/data/tasks.py) ---------------------------------------------------------------------

def _check(settings, in_memory_dataset: bool) -> None:
  del in_memory_dataset
  validate_config(settings)
  validate_rendered(settings)


def _stop_ids(settings, tokenizer) -> tuple[int, ...]:
  """Answer-only mode: completions also stop where the model closes the <answer> tag."""
  return closing_tag_ids(tokenizer) if settings.task.answer_only else ()


@register_task(PREFIX + "<dataset>", check=_check, stop_ids=_stop_ids,
               # by the accuracy reward's measure: full credit only for reasoning_gym_full_credit
               constant_answer=lambda settings, columns: constant_answer(
                   columns, full_credit=settings.eval.accuracy_reward == FULL_CREDIT_REWARD),
               takes=("options", "answer_only", "train_size", "train_seed", "heldout_size", "heldout_seed",
                      *RENDER_KEYS))  # any reasoning-gym dataset: "reasoning_gym:leg_counting"
def _reasoning_gym(settings, tokenizer, log) -> DatasetTask:
  t = settings.task
  needs_tokenizer(t.name, tokenizer)
  data = split(t.name, t.options, train_seed=t.train_seed, train_size=t.train_size,
               heldout_seed=t.heldout_seed, heldout_size=t.heldout_size, answer_only=t.answer_only)
  if not data.heldout:
    raise ValueError(f"config.task.heldout_seed: all {t.heldout_size} held-out questions of {t.name} are also "
                     "training questions (a small generator); give it more room (options) or fewer training items")
  task = DatasetTask(data.train, data.heldout, tokenizer, max_prompt_tokens=settings.sampling.max_prompt_length,
                     template=t.template, system_prompt=t.system_prompt, prefill_think=t.prefill_think,
                     seed=settings.seed, source=t.name, prefill=ANSWER_PREFILL if t.answer_only else "")
  dropped = task.num_dropped
  log(f"[data] {t.name}: {task.num_train} train / {task.num_heldout} held-out prompts; dropped "
      f"{data.num_duplicates} held-out questions that are also training questions, and "
      f"{dropped['train'] + dropped['heldout']} prompts longer than sampling.max_prompt_length="
      f"{settings.sampling.max_prompt_length} tokens ({dropped['train']} train, {dropped['heldout']} held-out)")
  return task
