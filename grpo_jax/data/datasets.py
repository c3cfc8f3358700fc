"""Question/answer datasets from local files: JSONL, Parquet, or a Hugging Face `save_to_disk` directory.

Every loaded row is a dict with the canonical fields
  prompt:       the question text, before any prompt template; or, in TRL's conversational form, a list of
                chat messages {"role": "system" | "user" | "assistant", "content": str}, which the "chat"
                template renders with the tokenizer's chat template as they are;
  answer:       the gold answer the reward functions compare against (column `answer` of the rewards);
plus every other column of the file, unchanged, so reward functions can read them (e.g. `numbers`, `target`).

Field mapping: `field_map={"prompt": "question", "answer": "final_answer"}` copies the named source columns
into the canonical fields as they are. Without a mapping, the layout is recognized from the columns:
  prompt [, answer]                       used as is;
  question, answer    (GSM8K)             answer := the number after "####", the full text kept in `solution`;
  problem, solution [, answer]  (MATH)    answer := the `answer` column if present, else the last \\boxed{} of
                                          the solution;
  nums|numbers, target  (Countdown)       prompt := COUNTDOWN_QUESTION filled in, numbers := the list.
A row that lacks a field, has a value of the wrong type, or a GSM8K/MATH answer that cannot be extracted is
an error naming the file and the row (1-based; for JSONL the line number).

`save_to_disk` directories are read with pyarrow directly (the Arrow stream files listed in `state.json`), so
the `datasets` package is not needed; a `DatasetDict` directory (with `dataset_dict.json`) takes a split name.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from grpo_jax.config_checks import Section
from grpo_jax.data.tasks import (RENDER_KEYS, DatasetTask, needs_tokenizer, plain_dict, register_task,
                                 validate_rendered)
from grpo_jax.rewards.answers import last_boxed

COUNTDOWN_QUESTION = ("Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
                      "arithmetic operations (+, -, *, /) and parentheses, and each number can be used at most "
                      "once. Give the final equation, for example <answer>(1 + 2) / 3</answer>.")

Row = dict[str, Any]


class DatasetError(ValueError):
  """A malformed dataset file or row; the message names the file and the row."""


# ------------------------------------------------------------------------------------------------ readers
def _read_jsonl(path: str) -> Iterator[tuple[str, dict]]:
  with open(path, "rb") as f:   # bytes, so that a decoding error can name its line
    for line_no, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DatasetError(f"{path}, line {line_no}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}"
                           f"); re-encode the file as UTF-8") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(f"{path}, line {line_no}: not valid JSON ({e.msg})") from None
      if not isinstance(record, dict):
        raise DatasetError(f"{path}, line {line_no}: expected a JSON object, got {type(record).__name__}")
      yield f"line {line_no}", record


def _rows_of_table(table) -> list[tuple[str, dict]]:
  return [(f"row {i}", record) for i, record in enumerate(table.to_pylist(), start=1)]


def _read_arrow_file(path: str):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  with pa.memory_map(path) as source:
    try:
      return pa.ipc.open_stream(source).read_all()  # what `datasets` writes
    except pa.ArrowInvalid:
      source.seek(0)
      return pa.ipc.open_file(source).read_all()


def _read_saved_dataset(path: str, split: str | None):
  """The table of a `save_to_disk` directory (a Dataset, or one split of a DatasetDict)."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  dict_file = os.path.join(path, "dataset_dict.json")
  if os.path.exists(dict_file):
    with open(dict_file, encoding="utf-8") as f:
      splits = json.load(f).get("splits", [])
    if split is None or split not in splits:
      raise DatasetError(f"{path} is a DatasetDict with splits {splits}; choose one with split=... "
                         f"(got {split!r})")
    path = os.path.join(path, split)
  state_file = os.path.join(path, "state.json")
  if os.path.exists(state_file):
    with open(state_file, encoding="utf-8") as f:
      state = json.load(f)
    files = [os.path.join(path, entry["filename"]) for entry in state.get("_data_files", [])]
    if state.get("_indices_data_files"):
      raise DatasetError(f"{path} stores an indices mapping; call flatten_indices() before save_to_disk")
  else:
    files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".arrow"))
  if not files:
    raise DatasetError(f"{path}: no .arrow data files found (expected a datasets save_to_disk directory)")
  tables = [_read_arrow_file(name) for name in files]
  return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def read_records(path: str, split: str | None = None) -> list[tuple[str, dict]]:
  """(row label, raw record) pairs of a .jsonl, .parquet or .arrow file or a save_to_disk directory; `split`
  only matters for a DatasetDict directory."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"dataset path {path!r} does not exist")
  if os.path.isdir(path):
    return _rows_of_table(_read_saved_dataset(path, split))
  if path.endswith((".jsonl", ".jsonl.txt", ".ndjson")):
    return list(_read_jsonl(path))
  if path.endswith((".parquet", ".pq")):
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel  (only needed for this format)
    return _rows_of_table(pq.read_table(path))
  if path.endswith(".arrow"):
    return _rows_of_table(_read_arrow_file(path))
  raise DatasetError(f"{path}: unknown dataset format (expected .jsonl, .parquet, .arrow or a save_to_disk "
                     "directory)")


# ------------------------------------------------------------------------------------------------ layouts
def _gsm8k_answer(text: Any, where: str) -> str:
  if not isinstance(text, str) or "####" not in text:
    raise DatasetError(f"{where}: GSM8K answer must be a string containing '#### <number>', got {text!r:.80}")
  final = text.rsplit("####", 1)[1].strip()
  if not final:
    raise DatasetError(f"{where}: nothing after '####' in the GSM8K answer")
  return final.replace(",", "")


def _math_answer(solution: Any, where: str) -> str:
  if not isinstance(solution, str):
    raise DatasetError(f"{where}: MATH solution must be a string, got {type(solution).__name__}")
  boxed = last_boxed(solution)
  if boxed is None or not boxed.strip():
    raise DatasetError(f"{where}: MATH solution has no \\boxed{{...}} answer")
  return boxed


def detect_layout(columns: Sequence[str]) -> str:
  """"prompt", "gsm8k", "math" or "countdown" from a row's column names; DatasetError otherwise."""
  cols = set(columns)
  if "prompt" in cols:
    return "prompt"
  if {"question", "answer"} <= cols:
    return "gsm8k"
  if {"problem", "solution"} <= cols:
    return "math"
  if "target" in cols and cols & {"nums", "numbers"}:
    return "countdown"
  raise DatasetError(f"columns {sorted(cols)} match no known layout (prompt/answer, GSM8K question/answer, "
                     "MATH problem/solution, Countdown nums/target); give a field_map")


MESSAGE_ROLES = ("system", "user", "assistant")


def _check_messages(messages: list, where: str) -> None:
  """TRL's conversational form: [{"role": "system" | "user" | "assistant", "content": str}, ...]."""
  if not messages:
    raise DatasetError(f"{where}: field 'prompt' is an empty list of messages")
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in MESSAGE_ROLES:
      raise DatasetError(f"{where}: message {i} of 'prompt' must be {{'role': one of {list(MESSAGE_ROLES)}, "
                         f"'content': a string}}, got {m!r:.80}")


def _check_prompt_and_answer(row: Row, where: str) -> Row:
  prompt = row.get("prompt")
  if isinstance(prompt, (list, tuple)):
    _check_messages(list(prompt), where)
    row["prompt"] = [{"role": m["role"], "content": m["content"]} for m in prompt]
  elif not isinstance(prompt, str) or not prompt.strip():
    raise DatasetError(f"{where}: field 'prompt' must be a non-empty string or a list of chat messages, got "
                       f"{prompt!r:.80}")
  if "answer" in row:
    answer = row["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
      raise DatasetError(f"{where}: field 'answer' must be a string or a number, got "
                         f"{type(answer).__name__} {answer!r:.80}")
  return row


def canonical_row(record: dict, where: str, field_map: Mapping[str, str] | None = None,
                  layout: str | None = None) -> Row:
  """One raw record as a canonical row (module docstring); `where` names it in errors."""
  row = dict(record)
  if field_map:
    for field, column in field_map.items():
      if column not in record or record[column] is None:
        raise DatasetError(f"{where}: missing field {column!r} (mapped to {field!r}); the row has "
                           f"{sorted(k for k, v in record.items() if v is not None)}")
      row[field] = record[column]
    if "prompt" not in row:
      raise DatasetError(f"{where}: no 'prompt' field; field_map must map 'prompt' to a column")
    return _check_prompt_and_answer(row, where)

  layout = layout or detect_layout(record)
  needed = {"prompt": ["prompt"], "gsm8k": ["question", "answer"], "math": ["problem", "solution"],
            "countdown": ["target"]}[layout]
  for column in needed:
    if record.get(column) is None:
      raise DatasetError(f"{where}: missing field {column!r} for the {layout} layout")
  if layout == "gsm8k":
    row.update(prompt=record["question"], solution=record["answer"],
               answer=_gsm8k_answer(record["answer"], where))
  elif layout == "math":
    if not isinstance(record["problem"], str):
      raise DatasetError(f"{where}: field 'problem' must be a string, got {type(record['problem']).__name__}")
    answer = record.get("answer")
    row.update(prompt=record["problem"], answer=answer if answer is not None
               else _math_answer(record["solution"], where))
  elif layout == "countdown":
    numbers = record.get("numbers", record.get("nums"))
    target = record["target"]
    if (not isinstance(numbers, (list, tuple)) or not numbers
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in numbers)):
      raise DatasetError(f"{where}: Countdown numbers must be a non-empty list of integers, got {numbers!r:.80}")
    if isinstance(target, bool) or not isinstance(target, int):
      raise DatasetError(f"{where}: Countdown target must be an integer, got {target!r:.80}")
    row.update(numbers=list(numbers), target=target,
               prompt=record.get("prompt") or COUNTDOWN_QUESTION.format(numbers=list(numbers), target=target))
    row.pop("nums", None)
  return _check_prompt_and_answer(row, where)


def load_rows(path: str, field_map: Mapping[str, str] | None = None, split: str | None = None,
              max_rows: int | None = None) -> list[Row]:
  """Canonical rows of one file or directory (see the module docstring)."""
  if field_map is not None and (not isinstance(field_map, Mapping)
                                or not all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in field_map.items())):
    raise TypeError(f"field_map must map canonical field names to column names (str -> str), got {field_map!r}")
  records = read_records(path, split)
  if max_rows is not None:
    records = records[:max_rows]
  if not records:
    raise DatasetError(f"{path}: no rows")
  layout = None if field_map else detect_layout(records[0][1])
  return [canonical_row(record, f"{path}, {label}", field_map, layout) for label, record in records]


def rows_in_memory(dataset, name: str, field_map: Mapping[str, str] | None = None) -> list[Row]:
  """Canonical rows of a dataset held in memory: a list of dicts, a `datasets.Dataset`, or any iterable of
  dict rows; errors name it `name` and the row (1-based), as for files."""
  if isinstance(dataset, (str, bytes, dict)) or not hasattr(dataset, "__iter__"):
    raise DatasetError(f"{name}: expected a list of row dicts or a datasets.Dataset, got {type(dataset).__name__}")
  records = list(dataset)
  if not records:
    raise DatasetError(f"{name}: no rows")
  for i, record in enumerate(records):
    if not isinstance(record, Mapping):
      raise DatasetError(f"{name}, row {i + 1}: a row must be a dict, got {type(record).__name__}")
  layout = None if field_map else detect_layout(records[0])  # the first row's layout, as for files
  return [canonical_row(dict(r), f"{name}, row {i + 1}", field_map, layout) for i, r in enumerate(records)]


# ------------------------------------------------------------------------------------------------ splits
def split_rows(rows: Sequence[Row], heldout_fraction: float, seed: int) -> tuple[list[Row], list[Row]]:
  """A deterministic (train, held-out) split: round(n * fraction) rows chosen by a seeded permutation, both
  parts kept in file order. The same rows, fraction and seed always give the same split."""
  n = len(rows)
  if not 0.0 <= heldout_fraction < 1.0:
    raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
  k = int(round(n * heldout_fraction))
  if heldout_fraction > 0 and not 0 < k < n:
    raise ValueError(f"heldout_fraction={heldout_fraction} of {n} rows leaves an empty train or held-out part")
  heldout_idx = set(np.random.default_rng(seed).permutation(n)[:k].tolist())
  return ([row for i, row in enumerate(rows) if i not in heldout_idx],
          [row for i, row in enumerate(rows) if i in heldout_idx])


def load_train_heldout(train_path: str, heldout_path: str | None = None, *,
                       field_map: Mapping[str, str] | None = None, heldout_fraction: float = 0.0,
                       seed: int = 0, train_split: str | None = "train", heldout_split: str | None = "test",
                       max_rows: int | None = None) -> tuple[list[Row], list[Row]]:
  """(train rows, held-out rows).

  With `heldout_path`, each comes from its own file (for a DatasetDict directory, from the splits named
  `train_split` and `heldout_split`; the same directory may be given twice). Without it, the train file is
  split deterministically by `heldout_fraction` and `seed` (0.0: no held-out rows).
  """
  train = load_rows(train_path, field_map, train_split, max_rows)
  if heldout_path is not None:
    if heldout_fraction:
      raise ValueError("give either heldout_path or heldout_fraction, not both")
    return train, load_rows(heldout_path, field_map, heldout_split, max_rows)
  return split_rows(train, heldout_fraction, seed)


# --- The dataset task, a plug-in (grpo_jax/data/tasks.py) -----------------------------------------------------------

def _check_dataset(settings, in_memory_dataset: bool) -> None:
  t, s = settings.task, Section(settings.task, "task")
  if not t.train_path and not in_memory_dataset:
    s.fail("train_path", "the dataset task needs a data file or directory (JSONL, Parquet, .arrow or a "
           "save_to_disk directory)")
  for key in ("train_path", "heldout_path"):
    if s[key] and not os.path.exists(s[key]):
      s.fail(key, "does not exist")
  validate_rendered(settings)
  s.at_least(0, "max_rows")


@register_task("dataset", check=_check_dataset,
               takes=("train_path", "train_split", "heldout_path", "heldout_split", "field_map", "max_rows",
                      "heldout_fraction", *RENDER_KEYS, "rows"))
def _dataset(settings, tokenizer, log, train_rows=None, heldout_rows=None):
  t = settings.task
  needs_tokenizer("dataset", tokenizer)
  field_map = plain_dict(t.field_map) or None
  if train_rows is not None:
    source = "train_dataset"
    train = rows_in_memory(train_rows, source, field_map)
    if heldout_rows is not None:
      heldout = rows_in_memory(heldout_rows, "eval_dataset", field_map)
    else:
      train, heldout = split_rows(train, t.heldout_fraction, settings.seed)
  else:
    source = t.train_path
    train, heldout = load_train_heldout(
        t.train_path, t.heldout_path or None, field_map=field_map,
        heldout_fraction=0.0 if t.heldout_path else t.heldout_fraction, seed=settings.seed,
        train_split=t.train_split or None, heldout_split=t.heldout_split or None, max_rows=t.max_rows or None)
  task = DatasetTask(train, heldout, tokenizer, max_prompt_tokens=settings.sampling.max_prompt_length,
                     template=t.template, system_prompt=t.system_prompt, prefill_think=t.prefill_think,
                     seed=settings.seed, source=source)
  dropped = task.num_dropped
  log(f"[data] {source}: {task.num_train} train / {task.num_heldout} held-out prompts; dropped "
      f"{dropped['train'] + dropped['heldout']} prompts longer than sampling.max_prompt_length="
      f"{settings.sampling.max_prompt_length} tokens ({dropped['train']} train, {dropped['heldout']} held-out)")
  return task
