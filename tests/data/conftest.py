"""Small dataset files in every supported format, written to a tmp dir by the tests themselves."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

GSM8K_RECORDS = [
    {"question": "Tom has 3 boxes of 4 pens. How many pens?", "answer": "3 * 4 = <<3*4=12>>12\n#### 12"},
    {"question": "A shirt costs $20 and is 25% off. Price?", "answer": "20 * 0.75 = 15\n#### 15"},
    {"question": "It is 2 degrees and falls by 7. Temperature?", "answer": "2 - 7 = -5\n#### -5"},
    {"question": "A farm sells 1,250 eggs a day for 8 days. Total?", "answer": "1250 * 8\n#### 10,000"},
]
MATH_RECORDS = [
    {"problem": "Simplify $\\frac{6}{8}$.", "solution": "Divide by 2: $\\boxed{\\frac{3}{4}}$.",
     "level": "Level 1"},
    {"problem": "Solve $x^2 = 9$, $x > 0$.", "solution": "Try $\\boxed{-3}$? No: $x = \\boxed{3}$.",
     "level": "Level 2"},
    {"problem": "What is $\\sqrt{16}$?", "solution": "$\\sqrt{16} = \\boxed{4}$", "level": "Level 1"},
]
COUNTDOWN_RECORDS = [{"nums": [3, 5, 7], "target": 22}, {"nums": [10, 2, 6, 4], "target": 18}]


def write_jsonl(path, records):
  with open(path, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  return str(path)


def write_parquet(path, records):
  pq.write_table(pa.Table.from_pylist(records), path)
  return str(path)


def write_saved_dataset(path, records, num_files=1):
  """A directory laid out like `datasets.Dataset.save_to_disk`: Arrow stream shards listed in state.json."""
  os.makedirs(path, exist_ok=True)
  table = pa.Table.from_pylist(records)
  files = []
  per_file = -(-len(records) // num_files)
  for i in range(num_files):
    name = f"data-{i:05d}-of-{num_files:05d}.arrow"
    with pa.OSFile(os.path.join(path, name), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.slice(i * per_file, per_file))
    files.append({"filename": name})
  with open(os.path.join(path, "state.json"), "w") as f:
    json.dump({"_data_files": files, "_fingerprint": "0", "_format_type": None, "_split": None}, f)
  with open(os.path.join(path, "dataset_info.json"), "w") as f:
    json.dump({"features": {}}, f)
  return str(path)


def write_dataset_dict(path, splits):
  for name, records in splits.items():
    write_saved_dataset(os.path.join(path, name), records, num_files=2)
  with open(os.path.join(path, "dataset_dict.json"), "w") as f:
    json.dump({"splits": list(splits)}, f)
  return str(path)


@pytest.fixture
def gsm8k_jsonl(tmp_path):
  return write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_RECORDS)
