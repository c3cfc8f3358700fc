import json

import pytest

from grpo_jax.data.datasets import (COUNTDOWN_QUESTION, DatasetError, detect_layout, load_rows,
                                    load_train_heldout, split_rows)
from grpo_jax.rewards import gsm8k_accuracy, math_accuracy

from .conftest import (COUNTDOWN_RECORDS, GSM8K_RECORDS, MATH_RECORDS, write_dataset_dict, write_jsonl,
                       write_parquet, write_saved_dataset)

WRITERS = {"jsonl": (write_jsonl, "d.jsonl"), "parquet": (write_parquet, "d.parquet"),
           "save_to_disk": (write_saved_dataset, "d_saved")}


@pytest.mark.parametrize("fmt", WRITERS)
def test_gsm8k_layout_in_every_format(tmp_path, fmt):
  write, name = WRITERS[fmt]
  rows = load_rows(write(tmp_path / name, GSM8K_RECORDS))
  assert [r["prompt"] for r in rows] == [r["question"] for r in GSM8K_RECORDS]
  assert [r["answer"] for r in rows] == ["12", "15", "-5", "10000"]
  assert rows[0]["solution"] == GSM8K_RECORDS[0]["answer"]
  # The extracted gold answers are what the GSM8K reward compares against.
  completions = ["<answer>12</answer>", "<answer>$15.00</answer>", "<answer>\u22125</answer>", "10,000"]
  assert gsm8k_accuracy([r["prompt"] for r in rows], completions, answer=[r["answer"] for r in rows]) == [1.0] * 4


CONVERSATIONS = [
    {"prompt": [{"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": "What is 2 + 2?"}], "answer": "4"},
    {"prompt": [{"role": "user", "content": "What is 3 + 5?"}, {"role": "assistant", "content": "8"},
                {"role": "user", "content": "And 8 + 1?"}], "answer": "9"},
]


@pytest.mark.parametrize("fmt", WRITERS)
def test_conversational_prompts_in_every_format(tmp_path, fmt):
  """TRL's conversational datasets: a list of chat messages as the prompt, rendered by the chat template."""
  from grpo_jax import testing
  from grpo_jax.data.templates import tokenize_prompts
  write, name = WRITERS[fmt]
  rows = load_rows(write(tmp_path / name, CONVERSATIONS))
  assert [r["prompt"] for r in rows] == [r["prompt"] for r in CONVERSATIONS]
  tokenizer = testing.build_tokenizer()
  kept, dropped = tokenize_prompts(rows, tokenizer, 512, template="chat", system_prompt="Be brief.")
  assert dropped == 0
  # The row's own system message stands; a conversation without one gets the configured system prompt.
  want = [CONVERSATIONS[0]["prompt"], [{"role": "system", "content": "Be brief."}] + CONVERSATIONS[1]["prompt"]]
  assert [r["prompt_text"] for r in kept] == [
      tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in want]


@pytest.mark.parametrize("fmt", WRITERS)
def test_math_layout_takes_the_last_box(tmp_path, fmt):
  write, name = WRITERS[fmt]
  rows = load_rows(write(tmp_path / name, MATH_RECORDS))
  assert [r["answer"] for r in rows] == ["\\frac{3}{4}", "3", "4"]
  assert [r["level"] for r in rows] == ["Level 1", "Level 2", "Level 1"]  # other columns pass through
  assert math_accuracy([""] * 3, ["\\boxed{0.75}", "\\boxed{-3}", "\\boxed{4}"],
                       answer=[r["answer"] for r in rows]) == [1.0, 0.0, 1.0]


def test_math_answer_column_wins_over_solution(tmp_path):
  records = [{"problem": "p", "solution": "\\boxed{1}", "answer": "2"}]
  assert load_rows(write_jsonl(tmp_path / "m.jsonl", records))[0]["answer"] == "2"


def test_countdown_layout(tmp_path):
  rows = load_rows(write_parquet(tmp_path / "c.parquet", COUNTDOWN_RECORDS))
  assert rows[0]["numbers"] == [3, 5, 7] and rows[0]["target"] == 22 and "nums" not in rows[0]
  assert rows[1]["prompt"] == COUNTDOWN_QUESTION.format(numbers=[10, 2, 6, 4], target=18)


def test_field_map(tmp_path):
  records = [{"q": "2+2?", "final": 4, "id": 7}, {"q": "3+3?", "final": "6", "id": 8}]
  path = write_jsonl(tmp_path / "custom.jsonl", records)
  rows = load_rows(path, field_map={"prompt": "q", "answer": "final"})
  assert [(r["prompt"], r["answer"], r["id"]) for r in rows] == [("2+2?", 4, 7), ("3+3?", "6", 8)]
  with pytest.raises(DatasetError, match="match no known layout"):
    load_rows(path)
  with pytest.raises(DatasetError, match="'prompt'"):
    load_rows(path, field_map={"answer": "final"})
  with pytest.raises(TypeError, match="field_map"):
    load_rows(path, field_map={"prompt": 3})


def test_dataset_dict_splits(tmp_path):
  path = write_dataset_dict(tmp_path / "dd", {"train": GSM8K_RECORDS, "test": GSM8K_RECORDS[:1]})
  train, heldout = load_train_heldout(path, path)
  assert len(train) == 4 and [r["answer"] for r in train] == ["12", "15", "-5", "10000"]  # 2 shards, in order
  assert [r["answer"] for r in heldout] == ["12"]
  with pytest.raises(DatasetError, match=r"splits \['train', 'test'\]"):
    load_rows(path)
  with pytest.raises(DatasetError, match="splits"):
    load_rows(path, split="validation")


def test_deterministic_split_by_seed_and_fraction(tmp_path):
  records = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]
  path = write_jsonl(tmp_path / "p.jsonl", records)
  train, heldout = load_train_heldout(path, heldout_fraction=0.25, seed=3)
  assert len(heldout) == 5 and len(train) == 15
  assert sorted(r["answer"] for r in train + heldout) == sorted(str(i) for i in range(20))  # a partition
  assert [int(r["answer"]) for r in train] == sorted(int(r["answer"]) for r in train)  # file order kept
  again = load_train_heldout(path, heldout_fraction=0.25, seed=3)
  assert again == (train, heldout)
  other = load_train_heldout(path, heldout_fraction=0.25, seed=4)[1]
  assert other != heldout
  assert load_train_heldout(path)[1] == []
  with pytest.raises(ValueError, match="empty"):
    split_rows(records[:1], 0.5, 0)
  with pytest.raises(ValueError, match=r"\[0, 1\)"):
    split_rows(records, 1.0, 0)
  with pytest.raises(ValueError, match="either"):
    load_train_heldout(path, path, heldout_fraction=0.1)


def test_max_rows(gsm8k_jsonl):
  assert len(load_rows(gsm8k_jsonl, max_rows=2)) == 2


@pytest.mark.parametrize("records,match", [
    ([GSM8K_RECORDS[0], {"question": "q"}], r"line 2: missing field 'answer'"),
    ([GSM8K_RECORDS[0], GSM8K_RECORDS[1], {"question": "q", "answer": "no marker"}], r"line 3: GSM8K answer"),
    ([{"question": "q", "answer": 12}], r"line 1: GSM8K answer must be a string"),
    ([MATH_RECORDS[0], {"problem": "p", "solution": "no box"}], r"line 2: MATH solution has no \\boxed"),
    ([{"problem": ["p"], "solution": "\\boxed{1}"}], r"line 1: field 'problem' must be a string"),
    ([{"prompt": "p", "answer": "1"}, {"prompt": 5, "answer": "1"}], r"line 2: field 'prompt' must be"),
    ([{"prompt": "p", "answer": "1"}, {"prompt": "p", "answer": [1]}], r"line 2: field 'answer' must be"),
    ([{"prompt": [], "answer": "1"}], r"line 1: field 'prompt' is an empty list of messages"),
    ([{"prompt": [{"role": "user", "content": "q"}, {"role": "bot", "content": "x"}], "answer": "1"}],
     r"line 1: message 1 of 'prompt' must be"),
    ([{"nums": [1, "2"], "target": 3}], r"line 1: Countdown numbers"),
    ([{"nums": [1, 2], "target": "3"}], r"line 1: Countdown target"),
])
def test_malformed_jsonl_rows_name_file_and_line(tmp_path, records, match):
  path = write_jsonl(tmp_path / "bad.jsonl", records)
  with pytest.raises(DatasetError, match=match) as info:
    load_rows(path)
  assert "bad.jsonl" in str(info.value)


def test_malformed_parquet_and_saved_rows(tmp_path):
  records = [{"question": "q1", "answer": "#### 1"}, {"question": None, "answer": "#### 2"}]
  with pytest.raises(DatasetError, match=r"bad\.parquet, row 2: missing field 'question'"):
    load_rows(write_parquet(tmp_path / "bad.parquet", records))
  with pytest.raises(DatasetError, match=r"saved, row 2: missing field 'question'"):
    load_rows(write_saved_dataset(tmp_path / "saved", records))
  with pytest.raises(DatasetError, match=r"row 2: missing field 'final'"):
    load_rows(write_parquet(tmp_path / "m.parquet", [{"q": "a", "final": "1"}, {"q": "b", "final": None}]),
              field_map={"prompt": "q", "answer": "final"})


def test_bad_files(tmp_path):
  path = tmp_path / "broken.jsonl"
  path.write_text(json.dumps(GSM8K_RECORDS[0]) + "\n\n{not json\n")
  with pytest.raises(DatasetError, match=r"broken\.jsonl, line 3: not valid JSON"):
    load_rows(str(path))
  # Latin-1 bytes on line 2 (a file saved in the wrong encoding): the error names the line and the byte.
  path.write_bytes(json.dumps(GSM8K_RECORDS[0]).encode() + b'\n{"question": "caf\xe9", "answer": "#### 1"}\n')
  with pytest.raises(DatasetError, match=r"broken\.jsonl, line 2: not UTF-8 \(byte 0xe9 at column 18\)"):
    load_rows(str(path))
  path.write_text("[1, 2]\n")
  with pytest.raises(DatasetError, match="line 1: expected a JSON object"):
    load_rows(str(path))
  path.write_text("")
  with pytest.raises(DatasetError, match="no rows"):
    load_rows(str(path))
  with pytest.raises(FileNotFoundError, match="nope"):
    load_rows(str(tmp_path / "nope.jsonl"))
  (tmp_path / "data.csv").write_text("a,b\n")
  with pytest.raises(DatasetError, match="unknown dataset format"):
    load_rows(str(tmp_path / "data.csv"))
  (tmp_path / "empty_dir").mkdir()
  with pytest.raises(DatasetError, match="no .arrow data files"):
    load_rows(str(tmp_path / "empty_dir"))


def test_detect_layout():
  assert detect_layout(["question", "answer"]) == "gsm8k"
  assert detect_layout(["problem", "solution", "level"]) == "math"
  assert detect_layout(["numbers", "target"]) == "countdown"
  assert detect_layout(["prompt", "question", "answer"]) == "prompt"
