"""Tasks: what the training loop draws prompts from, whatever their source.

A task offers
  tokenizer               encodes prompts, decodes completions (pad_token_id and eos_token_id set);
  train_rows(start, n)    rows start .. start+n-1 of an endless training stream, as columns (lists):
                          "prompt" (the text fed to the model, template applied) and the reward columns
                          (e.g. "answer", or "numbers" and "target"); row i depends only on (seed, i), so a
                          checkpoint resumes the stream from the data position alone;
  eval_rows(n)            the first n held-out rows (fewer when the held-out set is smaller), same columns.
`stop_ids(tokenizer)` gives the token ids that end a completion.

Tasks (`config.task.name`):
  "addition"  the synthetic task of `synthetic.py` (character tokens, or the checkpoint's tokenizer when
              `config.model.hf_path` is set).
  "chain_sum" sums of 3-8 single digits that the model may write out as running sums (`synthetic.py`,
              character tokens): completions whose length the policy chooses.
  "dataset"   question/answer rows from local files (`datasets.py`: JSONL, Parquet, save_to_disk; GSM8K,
              MATH and Countdown layouts, or a field map), rendered with a prompt template (`templates.py`)
              and tokenized by the checkpoint's tokenizer. Prompts longer than
              `config.sampling.max_prompt_length` tokens are dropped and counted (one log line). Each epoch
              visits the training rows in a fresh seeded order.
  "reasoning_gym:<dataset>"  any reasoning-gym dataset, or a weighted composite (`reasoning_gym.py`, the optional
              extra [gym]): items from seeded generators, training and held-out from different seeds, rendered and
              tokenized like dataset rows, scored by the `reasoning_gym` reward (the dataset's own verifier).
  "word_arithmetic"  sums asked in English ("What is 37 + 45?", `word_arithmetic.py`), generated in memory and
              served like dataset rows (chat template, checkpoint's tokenizer), for instruct models.

Each name is a builder registered in `TASKS` (`@register_task("name") def build(config, tokenizer, log)`).

A task may also offer `transfer_sets` (names) and `transfer_rows(name, n)`: further held-out sets
(`config.task.transfer`), never trained on, evaluated at the start and the end of a run to measure whether what
was learned carries over.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from grpo_jax import storage
from grpo_jax.config_checks import Section, fail
from grpo_jax.data import reasoning_gym, templates, word_arithmetic
from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.data.datasets import load_train_heldout, rows_in_memory, split_rows
from grpo_jax.data.synthetic import AdditionTask, ChainSumTask, ToolArithmeticTask
from grpo_jax.data.templates import tokenize_prompts
from grpo_jax.registry import Registry

# name -> builder(config, tokenizer, log) -> task; tokenizer: the checkpoint's (config.model.hf_path) or None. The
# dataset builder also takes the rows of a notebook's train_dataset / eval_dataset.
TASKS = Registry("task")
register_task = TASKS.register
# Special tokens that end an assistant turn or a document in common checkpoints (Qwen/ChatML, Llama 3, Gemma). An
# instruct model ends its answer with the end-of-turn token, which need not be the tokenizer's eos.
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")
_INTERNAL = ("prompt_ids", "prompt_text")


def stop_ids(tokenizer) -> tuple[int, ...]:
  """The eos id, then the ids of the END_TOKENS that are special tokens of this tokenizer."""
  ids = [int(tokenizer.eos_token_id)]
  if not isinstance(tokenizer, CharTokenizer):
    special = set(getattr(tokenizer, "all_special_tokens", ())) | set(tokenizer.get_added_vocab())
    for token in END_TOKENS:
      if token in special:
        ids.append(int(tokenizer.convert_tokens_to_ids(token)))
  return tuple(dict.fromkeys(ids))


def load_hf_tokenizer(path: str):
  """The checkpoint's tokenizer, with padding set to eos when it has no pad token."""
  from grpo_jax.model import hf_io
  tokenizer = hf_io.load_tokenizer(path)
  if tokenizer.eos_token_id is None:
    raise ValueError(f"the tokenizer in {path} has no eos_token_id: completions need a stop token")
  if tokenizer.pad_token_id is None:
    tokenizer.pad_token_id = tokenizer.eos_token_id
  return tokenizer


def _bos_prefix(tokenizer) -> str:
  """The BOS text the tokenizer adds by itself (e.g. Llama's "<|begin_of_text|>"); "" for Qwen."""
  plain = tokenizer("a", add_special_tokens=False)["input_ids"]
  special = tokenizer("a", add_special_tokens=True)["input_ids"]
  bos = getattr(tokenizer, "bos_token", None)
  if bos and len(special) > len(plain) and special[0] == tokenizer.bos_token_id:
    return bos
  return ""


class DatasetTask:
  """Prompts from dataset rows (module docstring). Rows are dicts with 'prompt' (the question) and columns."""

  name = "dataset"

  def __init__(self, train: Sequence[dict], heldout: Sequence[dict], tokenizer, *, max_prompt_tokens: int,
               template: str = "plain", system_prompt: str = "", prefill_think: bool = False, seed: int = 0,
               source: str = "dataset", transfer: dict[str, Sequence[dict]] | None = None, prefill: str = ""):
    self.tokenizer = tokenizer
    self.seed = seed
    self.stop_ids = stop_ids(tokenizer)
    render = dict(tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens, template=template,
                  system_prompt=system_prompt or None, prefill_think=prefill_think, prefill=prefill)
    self._train, dropped_train = tokenize_prompts(train, **render)
    self._heldout, dropped_heldout = tokenize_prompts(heldout, **render)
    self._transfer = {name: tokenize_prompts(rows, **render)[0] for name, rows in (transfer or {}).items()}
    self.num_dropped = {"train": dropped_train, "heldout": dropped_heldout}
    if not self._train:
      raise ValueError(f"{source}: all {len(train)} training prompts are longer than "
                       f"config.sampling.max_prompt_length={max_prompt_tokens} tokens")
    if not self._heldout:
      raise ValueError(f"{source}: no held-out prompts ({len(heldout)} held-out rows, {dropped_heldout} of them "
                       f"longer than config.sampling.max_prompt_length={max_prompt_tokens} tokens); set "
                       "config.task.heldout_path or config.task.heldout_fraction")
    if template != "chat":  # the loop encodes prompt texts without special tokens: write the BOS into the text.
      bos = _bos_prefix(tokenizer)
      for row in self._train + self._heldout + [r for rows in self._transfer.values() for r in rows]:
        row["prompt_text"] = bos + row["prompt_text"]
    self._check_round_trip(self._train[0])
    self._columns = sorted({k for row in self._train + self._heldout for k in row} - set(_INTERNAL) - {"prompt"})
    self._epoch, self._order = -1, None

  def _check_round_trip(self, row: dict):
    again = list(self.tokenizer(row["prompt_text"], add_special_tokens=False)["input_ids"])
    if again != row["prompt_ids"]:
      raise ValueError(f"the rendered prompt {row['prompt_text'][:80]!r} does not re-encode to the same tokens; "
                       "the tokenizer is not supported as is")

  @property
  def num_train(self) -> int:
    return len(self._train)

  @property
  def num_heldout(self) -> int:
    return len(self._heldout)

  def _train_index(self, i: int) -> int:
    epoch, pos = divmod(i, len(self._train))
    if epoch != self._epoch:
      self._epoch = epoch
      self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self._train))
    return int(self._order[pos])

  def _as_columns(self, rows: list[dict]) -> dict[str, list]:
    columns: dict[str, list[Any]] = {"prompt": [row["prompt_text"] for row in rows]}
    for key in self._columns:
      columns[key] = [row.get(key) for row in rows]
    return columns

  def train_rows(self, start: int, n: int) -> dict[str, list]:
    return self._as_columns([self._train[self._train_index(i)] for i in range(start, start + n)])

  def eval_rows(self, n: int) -> dict[str, list]:
    return self._as_columns(self._heldout[:n])

  @property
  def transfer_sets(self) -> tuple[str, ...]:
    return tuple(self._transfer)

  def transfer_rows(self, name: str, n: int) -> dict[str, list]:
    return self._as_columns(self._transfer[name][:n])


def make_task(config, log: Callable[[str], None] = print, train_rows: Iterable[dict] | None = None,
              heldout_rows: Iterable[dict] | None = None):
  """The task named by `config.task.name`, its tokenizer from `config.model.hf_path` when that is set.

  `train_rows` / `heldout_rows`: the dataset task's rows in memory (a list of dicts or a `datasets.Dataset`),
  instead of task.train_path / task.heldout_path; without `heldout_rows`, task.heldout_fraction of the train
  rows are held out."""
  t = config.task
  if train_rows is not None and t.name != "dataset":
    raise ValueError(f"a train_dataset needs config.task.name = 'dataset', not {t.name!r}")
  build = TASKS.get(t.name)
  tokenizer = load_hf_tokenizer(storage.local_dir(config.model.hf_path)) if config.model.hf_path else None
  rows = {} if train_rows is None else {"train_rows": train_rows, "heldout_rows": heldout_rows}
  return build(config, tokenizer, log, **rows)


def validate_config(config, in_memory_dataset: bool = False) -> None:
  """Checks `config.task` and what the named task needs of the rest (a tokenizer from model.hf_path or none,
  prompt and answer widths); raises ConfigError naming key and value. `in_memory_dataset`: the dataset task's
  rows come from a notebook's `train_dataset` (grpo_jax/train/inputs.py), not task.train_path."""
  t, s = config.task, Section(config.task, "task")
  s.registered("name", TASKS)
  s.within("heldout_fraction", 0, 1, open_low=True, open_high=True)
  if t.name == "dataset":
    if not t.train_path and not in_memory_dataset:
      s.fail("train_path", "the dataset task needs a data file or directory (JSONL, Parquet, .arrow or a "
             "save_to_disk directory)")
    for key in ("train_path", "heldout_path"):
      if s[key] and not os.path.exists(s[key]):
        s.fail(key, "does not exist")
    _validate_rendered_task(config)
    s.at_least(0, "max_rows")
  if reasoning_gym.is_gym_task(t.name):
    reasoning_gym.validate_config(config)
    _validate_rendered_task(config)
  elif t.options:
    fail("task.options", f"only reasoning_gym tasks take options, not {t.name!r}")
  elif t.answer_only:
    s.fail("answer_only", f"only reasoning_gym tasks have an answer-only mode, not {t.name!r}")
  if t.name == "chain_sum":
    _validate_chain_sum_task(config)
  if t.name == "tool_arithmetic":
    s.within("tool_fraction", 0, 1)
  if t.name == "word_arithmetic":
    if not config.model.hf_path:
      fail("model.hf_path", "the word_arithmetic task needs a Hugging Face checkpoint directory (its tokenizer "
           "and chat template)", config.model.hf_path)
    for name in transfer_names(config):
      if name not in word_arithmetic.TRANSFER_SETS:
        s.fail("transfer", f"{name!r} is not one of {list(word_arithmetic.TRANSFER_SETS)}")
  elif t.transfer:
    s.fail("transfer", f"only the word_arithmetic task has transfer sets, not {t.name!r}")


def _validate_chain_sum_task(config) -> None:
  t, s = config.task, Section(config.task, "task")
  if not 2 <= t.min_terms <= t.max_terms <= 12:
    s.fail("min_terms", f"chain_sum needs 2 <= task.min_terms <= task.max_terms <= 12 (task.max_terms="
           f"{t.max_terms})")
  s.within("scratchpad_fraction", 0, 1)
  if config.model.hf_path:
    fail("model.hf_path", "the chain_sum task uses its own character tokenizer; leave it empty", config.model.hf_path)
  task = ChainSumTask(t.min_terms, t.max_terms)
  sampling = Section(config.sampling, "sampling")
  if sampling["max_prompt_length"] < task.max_prompt_chars:
    sampling.fail("max_prompt_length", f"shorter than the longest chain_sum prompt ({task.max_prompt_chars} "
                  f"characters at task.max_terms={t.max_terms})")
  if sampling["max_new_tokens"] < task.max_answer_chars + 1:
    sampling.fail("max_new_tokens", f"cannot hold the longest written-out answer and its stop token "
                  f"({task.max_answer_chars + 1} at task.max_terms={t.max_terms})")


def _validate_rendered_task(config) -> None:
  """Tasks whose rows are rendered with a template and the checkpoint's tokenizer (dataset, reasoning_gym)."""
  t, s = config.task, Section(config.task, "task")
  if not config.model.hf_path:
    fail("model.hf_path", f"the {t.name} task needs a Hugging Face checkpoint directory (its tokenizer encodes the "
         "prompts)", config.model.hf_path)
  s.one_of("template", templates.TEMPLATES)
  if t.prefill_think and t.template == "plain":
    s.fail("prefill_think", "needs the r1_zero or chat template (the plain template asks for no <think>)")
  if t.system_prompt and t.template != "chat":
    s.fail("system_prompt", f"only the chat template has a system prompt, not {t.template!r}")


def _no_tokenizer(name: str, tokenizer) -> None:
  if tokenizer is not None:
    raise ValueError(f"config.model.hf_path: the {name} task uses its own character tokenizer; leave it empty")


def _needs_tokenizer(name: str, tokenizer, what: str = "its tokenizer encodes the prompts") -> None:
  if tokenizer is None:
    raise ValueError(f"config.model.hf_path: the {name} task needs a checkpoint directory ({what})")


@register_task("addition")
def _addition(config, tokenizer, log):
  t = config.task
  task = AdditionTask(t.num_digits, t.heldout_fraction, config.seed)
  if tokenizer is not None:
    task.tokenizer = tokenizer
  return task


@register_task("chain_sum")
def _chain_sum(config, tokenizer, log):
  t = config.task
  _no_tokenizer("chain_sum", tokenizer)
  return ChainSumTask(t.min_terms, t.max_terms, t.heldout_fraction, config.seed, t.scratchpad_fraction)


@register_task("tool_arithmetic")
def _tool_arithmetic(config, tokenizer, log):
  t = config.task
  _no_tokenizer("tool_arithmetic", tokenizer)
  return ToolArithmeticTask(t.heldout_fraction, config.seed, t.tool_fraction)


@register_task("dataset")
def _dataset(config, tokenizer, log, train_rows=None, heldout_rows=None):
  t = config.task
  _needs_tokenizer("dataset", tokenizer)
  field_map = _plain_dict(t.field_map) or None
  if train_rows is not None:
    source = "train_dataset"
    train = rows_in_memory(train_rows, source, field_map)
    if heldout_rows is not None:
      heldout = rows_in_memory(heldout_rows, "eval_dataset", field_map)
    else:
      train, heldout = split_rows(train, t.heldout_fraction, config.seed)
  else:
    source = t.train_path
    train, heldout = load_train_heldout(
        t.train_path, t.heldout_path or None, field_map=field_map,
        heldout_fraction=0.0 if t.heldout_path else t.heldout_fraction, seed=config.seed,
        train_split=t.train_split or None, heldout_split=t.heldout_split or None, max_rows=t.max_rows or None)
  task = DatasetTask(train, heldout, tokenizer, max_prompt_tokens=config.sampling.max_prompt_length,
                     template=t.template, system_prompt=t.system_prompt, prefill_think=t.prefill_think,
                     seed=config.seed, source=source)
  dropped = task.num_dropped
  log(f"[data] {source}: {task.num_train} train / {task.num_heldout} held-out prompts; dropped "
      f"{dropped['train'] + dropped['heldout']} prompts longer than sampling.max_prompt_length="
      f"{config.sampling.max_prompt_length} tokens ({dropped['train']} train, {dropped['heldout']} held-out)")
  return task


@register_task("word_arithmetic")
def _word_arithmetic(config, tokenizer, log):
  t = config.task
  _needs_tokenizer("word_arithmetic", tokenizer, "its tokenizer and chat template")
  # The plain template (base models): few-shot equations to continue; otherwise the English question.
  style = "few_shot" if t.template == "plain" else "question"
  train, heldout = word_arithmetic.split(t.num_digits, t.heldout_fraction, style)
  transfer = {name: word_arithmetic.transfer_rows(name, t.num_digits, t.heldout_fraction, config.eval.size, style)
              for name in transfer_names(config)}
  task = DatasetTask(train, heldout, tokenizer, max_prompt_tokens=config.sampling.max_prompt_length,
                     template=t.template, system_prompt=t.system_prompt, prefill_think=t.prefill_think,
                     seed=config.seed, source="word_arithmetic", transfer=transfer)
  log(f"[data] word_arithmetic: {task.num_train} train / {task.num_heldout} held-out prompts"
      + (f", transfer sets {', '.join(task.transfer_sets)}" if task.transfer_sets else ""))
  return task


@register_task(reasoning_gym.PREFIX + "<dataset>")  # any reasoning-gym dataset: "reasoning_gym:leg_counting"
def _reasoning_gym(config, tokenizer, log) -> DatasetTask:
  t = config.task
  _needs_tokenizer(t.name, tokenizer)
  data = reasoning_gym.split(t.name, t.options, train_seed=t.train_seed, train_size=t.train_size,
                             heldout_seed=t.heldout_seed, heldout_size=t.heldout_size, answer_only=t.answer_only)
  if not data.heldout:
    raise ValueError(f"config.task.heldout_seed: all {t.heldout_size} held-out questions of {t.name} are also "
                     "training questions (a small generator); give it more room (options) or fewer training items")
  task = DatasetTask(data.train, data.heldout, tokenizer, max_prompt_tokens=config.sampling.max_prompt_length,
                     template=t.template, system_prompt=t.system_prompt, prefill_think=t.prefill_think,
                     seed=config.seed, source=t.name, prefill=reasoning_gym.ANSWER_PREFILL if t.answer_only else "")
  dropped = task.num_dropped
  log(f"[data] {t.name}: {task.num_train} train / {task.num_heldout} held-out prompts; dropped "
      f"{data.num_duplicates} held-out questions that are also training questions, and "
      f"{dropped['train'] + dropped['heldout']} prompts longer than sampling.max_prompt_length="
      f"{config.sampling.max_prompt_length} tokens ({dropped['train']} train, {dropped['heldout']} held-out)")
  return task


def transfer_names(config) -> list[str]:
  """The names in `config.task.transfer` (comma-separated)."""
  return [name.strip() for name in config.task.transfer.split(",") if name.strip()]


def _plain_dict(mapping) -> dict:
  return mapping.to_dict() if hasattr(mapping, "to_dict") else dict(mapping)
