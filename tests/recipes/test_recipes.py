"""The recipes' `:test` presets end to end: a tiny random Qwen2 checkpoint loaded from disk with its tokenizer,
fixture data in GSM8K / Countdown layout, template, sampling, rewards, 2 GRPO updates, a checkpoint."""
from __future__ import annotations

import json
import os

import pytest

from grpo_jax.data.datasets import DatasetError
from grpo_jax.data.fixtures import gsm8k_records, write_jsonl
from grpo_jax.train import loop
from grpo_jax.train.metrics import read_jsonl
from tests.recipes.conftest import load_experiment

RECIPES = {
    "gsm8k": {"rewards": ("gsm8k_accuracy", "format_strict"), "prompt_start": "<|im_start|>system\n"},
    "countdown": {"rewards": ("countdown", "format_strict_prefilled"), "prompt_start": "A conversation between"},
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_test_preset_runs_two_steps_and_checkpoints(name, fixture_paths, compile_cache, tmp_path, capsys):
  config = load_experiment(name)("test")
  assert config.model.hf_path == fixture_paths["checkpoint"]
  # A reward that varies between random completions, so the update has a non-zero gradient.
  config.rewards["recipes_test_digit_fraction"] = 0.5
  workdir = str(tmp_path / name)
  summary = loop.train(config, workdir)

  assert summary.steps == 2
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records] == [0, 1, 2]
  for rec in records[1:]:
    for fn in RECIPES[name]["rewards"] + ("recipes_test_digit_fraction",):
      assert f"rewards/{fn}/mean" in rec and f"rewards/{fn}/std" in rec
    assert {"reward", "reward_std", "kl", "loss", "grad_norm", "completions/mean_length"} <= set(rec)
  assert any(rec["grad_norm"] > 0 for rec in records[1:])
  assert "eval/accuracy" in records[0] and "eval/accuracy" in records[-1]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["0", "2"]

  with open(os.path.join(workdir, "samples.jsonl")) as f:
    samples = [json.loads(line) for line in f]
  prompt = samples[0]["prompt"]
  assert prompt.startswith(RECIPES[name]["prompt_start"])
  if name == "countdown":
    assert prompt.endswith("Assistant: <think>")
  out = capsys.readouterr().out
  assert "dropped 0 prompts longer than sampling.max_prompt_length=192 tokens" in out


def test_malformed_row_stops_the_run_naming_file_and_row(fixture_paths, tmp_path):
  records = gsm8k_records()
  del records[2]["answer"]
  path = write_jsonl(str(tmp_path / "bad_gsm8k.jsonl"), records)
  config = load_experiment("gsm8k")("test")
  config.task.train_path = path
  with pytest.raises(DatasetError, match=r"bad_gsm8k\.jsonl, line 3: .*'answer'"):
    loop.train(config, str(tmp_path / "run"))
