"""Tasks: what the training loop draws prompts from, whatever their source.

A task offers
  tokenizer               encodes prompts, decodes completions (pad_token_id and eos_token_id set);
  train_rows(start, n)    rows start .. start+n-1 of an endless training stream, as columns (lists):
                          "prompt" (the text fed to the model, template applied) and the reward columns
                          (e.g. "answer", or "numbers" and "target"); row i depends only on (seed, i), so a
                          checkpoint resumes the stream from the data position alone;
  eval_rows(n)            the first n held-out rows (fewer when the held-out set is smaller), same columns.
`stop_ids(tokenizer)` gives the token ids that end a completion.

Tasks are plug-ins of equal standing: each registers itself in `TASKS` under its `config.task.name`,

    @register_task("name", check=..., stop_ids=..., constant_answer=..., takes=(...))
    def build(settings, tokenizer, log): ...   # -> a task; tokenizer: the checkpoint's (model.hf_path) or None

where `settings` is the run's frozen settings tree (grpo_jax/settings.py: `settings.task`, `settings.seed`, ...),
with what it brings besides its rows: `takes`, its section of `config.task`, the keys it reads ("rows": it also
takes a notebook's datasets in memory); `check(settings, in_memory_dataset)`, its checks of them (ConfigError
naming key and value, run by `validate_config`); `stop_ids(settings, tokenizer)`, token ids that also end its
completions; and `constant_answer(settings, eval_columns)`, (answer, score) of the best single answer, the floor
to read accuracy against (logged at step 0 as CONSTANT_ANSWER_METRIC, printed by grpo-evaluate). `config.task`
stays one flat section for the user (experiment files, `--config.task.X`), the union of the tasks' keys; a key
that the named task does not take must keep its default, or the run is refused before anything starts (a
`task.num_digits` set for a dataset task would otherwise be ignored silently).
The built-in plug-ins (`BUILTIN_TASKS`):
  "addition", "chain_sum", "tool_arithmetic"  generated tasks with character tokens (`synthetic.py`);
  "dataset"   question/answer rows from local files (`datasets.py`) or a notebook's rows, rendered with a prompt
              template (`templates.py`, `DatasetTask`);
  "word_arithmetic"  sums asked in English, for instruct models (`word_arithmetic.py`);
  "reasoning_gym:<dataset>"  any reasoning-gym dataset, or a weighted composite (`reasoning_gym.py`, the optional
              extra [gym]), scored by the dataset's own verifier.
The training loop, the samplers and the losses name none of them: they reach a task through this module.

A task may also offer `transfer_sets` (names) and `transfer_rows(name, n)`: further held-out sets
(`config.task.transfer`), never trained on, evaluated at the start and the end of a run to measure whether what
was learned carries over.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import numpy as np

from grpo_jax import storage
from grpo_jax.config_checks import Section, fail
from grpo_jax.data import templates
from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.data.templates import tokenize_prompts
from grpo_jax.model import hf_io
from grpo_jax.registry import Registry, same_definition
from grpo_jax.settings import TaskSettings

# The modules whose import registers the built-in tasks (module docstring).
BUILTIN_TASKS = ("grpo_jax.data.synthetic", "grpo_jax.data.datasets", "grpo_jax.data.word_arithmetic",
                 "grpo_jax.data.reasoning_gym")
# name -> TaskPlugin; tokenizer: the checkpoint's (config.model.hf_path) or None.
TASKS = Registry("task.name", "task", builtins=BUILTIN_TASKS)
# The keys of the tasks whose rows are rendered with a prompt template and the checkpoint's tokenizer.
RENDER_KEYS = ("template", "system_prompt", "prefill_think")
# A task's step-0 metric: what one constant answer scores on its held-out rows (the floor to read accuracy
# against; the start line prints it, sweep reports tabulate it).
CONSTANT_ANSWER_METRIC = "eval/constant_answer"


@dataclasses.dataclass(frozen=True)
class TaskPlugin:
  """A registered task: its builder and what it brings besides rows (module docstring)."""
  build: Callable
  check: Callable | None = None
  stop_ids: Callable | None = None
  constant_answer: Callable | None = None
  takes: frozenset = frozenset()

  def __call__(self, settings, tokenizer, log, **rows):
    return self.build(settings, tokenizer, log, **rows)


def register_task(name: str, *, check: Callable | None = None, stop_ids: Callable | None = None,
                  constant_answer: Callable | None = None, takes: Sequence[str] = (), overwrite: bool = False):
  """Decorator: registers the builder `build(settings, tokenizer, log[, train_rows, heldout_rows])` as the task
  `name` (a name ending in "<...>" is a pattern, e.g. "reasoning_gym:<dataset>"), with what it brings besides
  rows (module docstring); returns the builder unchanged. `takes`: the keys of `config.task` it reads besides
  its name (TaskSettings' fields), and "rows" if it takes datasets in memory."""
  unknown = set(takes) - set(task_keys()) - {"rows"}
  if unknown:
    raise ValueError(f"register_task({name!r}): takes {sorted(unknown)}, not keys of config.task "
                     f"({', '.join(task_keys())}) or 'rows'")

  def decorator(build: Callable) -> Callable:
    plugin = TaskPlugin(build, check, stop_ids, constant_answer, frozenset(takes))
    old = TASKS._entries.get(name)  # pylint: disable=protected-access
    # A reloaded module (a re-run notebook cell) replaces its own task silently, as Registry.register does.
    same = old is not None and same_definition(old.build, build)
    TASKS.register(name, overwrite=overwrite or same)(plugin)
    return build

  return decorator
# Special tokens that end an assistant turn or a document in common checkpoints (Qwen/ChatML, Llama 3, Gemma). An
# instruct model ends its answer with the end-of-turn token, which need not be the tokenizer's eos.
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")
_INTERNAL = ("prompt_ids", "prompt_text")


def stop_ids(tokenizer) -> tuple[int, ...]:
  """The eos id, then the ids of the END_TOKENS that are special tokens of this tokenizer."""
  ids = [int(tokenizer.eos_token_id)]
  if not isinstance(tokenizer, CharTokenizer):
    special = set(getattr(tokenizer, "all_special_tokens", ())) | set(tokenizer.get_added_vocab())
    ids += [int(tokenizer.convert_tokens_to_ids(token)) for token in END_TOKENS if token in special]
  return tuple(dict.fromkeys(ids))


def load_hf_tokenizer(path: str):
  """The checkpoint's tokenizer, with padding set to eos when it has no pad token."""
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
  return bos if bos and len(special) > len(plain) and special[0] == tokenizer.bos_token_id else ""


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
    columns = {key: [row.get(key) for row in rows] for key in self._columns}
    return {"prompt": [row["prompt_text"] for row in rows], **columns}

  def train_rows(self, start: int, n: int) -> dict[str, list]:
    return self._as_columns([self._train[self._train_index(i)] for i in range(start, start + n)])

  def eval_rows(self, n: int) -> dict[str, list]:
    return self._as_columns(self._heldout[:n])

  @property
  def transfer_sets(self) -> tuple[str, ...]:
    return tuple(self._transfer)

  def transfer_rows(self, name: str, n: int) -> dict[str, list]:
    return self._as_columns(self._transfer[name][:n])


def make_task(settings, log: Callable[[str], None] = print, train_rows: Iterable[dict] | None = None,
              heldout_rows: Iterable[dict] | None = None):
  """The task named by `config.task.name`, its tokenizer from `config.model.hf_path` when that is set.

  `train_rows` / `heldout_rows`: a notebook's rows in memory (a list of dicts or a `datasets.Dataset`), for a task
  that takes them ("rows"; the dataset task: instead of task.train_path / task.heldout_path; without
  `heldout_rows`, task.heldout_fraction of the train rows are held out)."""
  t = settings.task
  plugin = TASKS.get(t.name)
  if train_rows is not None and "rows" not in plugin.takes:
    raise ValueError(f"a train_dataset needs a task that takes rows in memory (config.task.name = "
                     f"{_takers('rows')}), not {t.name!r}")
  tokenizer = load_hf_tokenizer(storage.local_dir(settings.model.hf_path)) if settings.model.hf_path else None
  rows = {} if train_rows is None else {"train_rows": train_rows, "heldout_rows": heldout_rows}
  return plugin(settings, tokenizer, log, **rows)


def task_stop_ids(settings, tokenizer) -> tuple[int, ...]:
  """The token ids that end the configured task's completions besides `stop_ids(tokenizer)` (its stop rules)."""
  plugin = TASKS.get(settings.task.name)
  return tuple(plugin.stop_ids(settings, tokenizer)) if plugin.stop_ids else ()


def constant_answer(settings, eval_columns: dict) -> tuple[str, float] | None:
  """(answer, score) of the configured task's best single answer on these held-out columns, or None."""
  plugin = TASKS.get(settings.task.name)
  return plugin.constant_answer(settings, eval_columns) if plugin.constant_answer else None


def task_keys() -> tuple[str, ...]:
  """The keys of config.task that some tasks read and others do not: all but the name, which every task reads.
  Each task names the others it reads (`takes`)."""
  return tuple(f.name for f in dataclasses.fields(TaskSettings) if f.name != "name")


def _takers(key: str) -> str:
  """The tasks that read an optional key, as names ("reasoning_gym" for the pattern "reasoning_gym:<dataset>")."""
  names = sorted(name.split(":<", 1)[0] for name in TASKS if key in TASKS.get(name).takes)
  return ", ".join(names) or "none"


def validate_config(settings, in_memory_dataset: bool = False) -> None:
  """Checks `config.task` and what the named task needs of the rest (a tokenizer from model.hf_path or none,
  prompt and answer widths): the task's own checks, then that every key it does not take is at its default; raises
  ConfigError naming key and value. `in_memory_dataset`: the task's rows come from a notebook's `train_dataset`
  (grpo_jax/train/inputs.py), not from its files."""
  t, s = settings.task, Section(settings.task, "task")
  s.registered(TASKS)
  s.within("heldout_fraction", 0, 1, open_low=True, open_high=True)
  plugin = TASKS.get(t.name)
  if plugin.check is not None:
    plugin.check(settings, in_memory_dataset)
  defaults = TaskSettings()
  for key in task_keys():
    if key in plugin.takes or getattr(t, key) == getattr(defaults, key):
      continue
    what = TaskSettings.__dataclass_fields__[key].metadata.get("does", f"read task.{key}")
    message = (f"only {_takers(key)} tasks {what}, not {t.name!r} (leave it at its default "
               f"{getattr(defaults, key)!r})")
    if isinstance(getattr(t, key), dict):
      fail(f"task.{key}", message)
    s.fail(key, message)


def validate_rendered(settings) -> None:
  """Checks of the tasks whose rows are rendered with a template and the checkpoint's tokenizer (dataset,
  reasoning_gym)."""
  t, s = settings.task, Section(settings.task, "task")
  if not settings.model.hf_path:
    fail("model.hf_path", f"the {t.name} task needs a Hugging Face checkpoint directory (its tokenizer encodes the "
         "prompts)", settings.model.hf_path)
  s.one_of("template", templates.TEMPLATES)
  if t.prefill_think and t.template == "plain":
    s.fail("prefill_think", "needs the r1_zero or chat template (the plain template asks for no <think>)")
  if t.system_prompt and t.template != "chat":
    s.fail("system_prompt", f"only the chat template has a system prompt, not {t.template!r}")


def no_tokenizer(name: str, tokenizer) -> None:
  if tokenizer is not None:
    raise ValueError(f"config.model.hf_path: the {name} task uses its own character tokenizer; leave it empty")


def needs_tokenizer(name: str, tokenizer, what: str = "its tokenizer encodes the prompts") -> None:
  if tokenizer is None:
    raise ValueError(f"config.model.hf_path: the {name} task needs a checkpoint directory ({what})")


def transfer_names(settings) -> list[str]:
  """The names in `config.task.transfer` (comma-separated)."""
  return [name.strip() for name in settings.task.transfer.split(",") if name.strip()]


def plain_dict(mapping) -> dict:
  return mapping.to_dict() if hasattr(mapping, "to_dict") else dict(mapping)
