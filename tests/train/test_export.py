"""A run's policy out as a Hugging Face directory (`checkpoint.export_hf`, scripts/export.py): transformers loads
it, with the run's tokenizer and chat template, and its greedy completions equal grpo_jax's."""
from __future__ import annotations

import importlib.util
import json
import os

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from grpo_jax import testing
from grpo_jax.data.tasks import stop_ids
from grpo_jax.model import hf_io
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.train import loop
from grpo_jax.persist.layout import RunFiles
from tests.model.helpers import jax_logits, torch_logits
from tests.train.conftest import ROOT

NEW_TOKENS = 24


def _exporting_config():
  """One GRPO step of the GSM8K recipe's :test preset, exported at the end of the run."""
  spec = importlib.util.spec_from_file_location("gsm8k_recipe", os.path.join(ROOT, "experiments", "gsm8k.py"))
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  config = recipe.get_config("test")
  config.num_steps = 1
  config.checkpoint.export_hf = True
  return config


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
  """One GRPO step of the GSM8K recipe's :test preset, exported at the end of the run."""
  config = _exporting_config()
  workdir = str(tmp_path_factory.mktemp("run"))
  loop.train(config, workdir)
  return workdir, config


def test_the_export_holds_weights_tokenizer_chat_template_and_stop_tokens(exported_run):
  workdir, config = exported_run
  out = RunFiles(workdir).hf_model
  from transformers import AutoTokenizer
  tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
  assert tokenizer.chat_template == hf_io.load_tokenizer(config.model.hf_path).chat_template
  with open(os.path.join(out, "generation_config.json")) as f:
    generation = json.load(f)
  assert generation["eos_token_id"] == list(stop_ids(tokenizer))  # eos and <|im_end|>
  assert len(generation["eos_token_id"]) == 2
  # The weights are the run's last checkpoint.
  from grpo_jax.train.export import restore_run_params
  exported = nnx.state(hf_io.from_pretrained(out), nnx.Param)
  saved, step = restore_run_params(workdir, exported)
  assert step == config.num_steps
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_transformers_greedy_completions_equal_grpo_jax_on_the_export(exported_run):
  workdir, _ = exported_run
  out = RunFiles(workdir).hf_model
  from transformers import AutoModelForCausalLM, AutoTokenizer
  tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
  hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32).eval()
  model = hf_io.from_pretrained(out, dtype="float32")
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=NEW_TOKENS, greedy=True, stop_ids=stop_ids(tokenizer),
                                             pad_id=tokenizer.pad_token_id))
  questions = [r["question"] for r in testing.gsm8k_records()[:4]]
  for question in questions:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    with torch.no_grad():
      want = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
    res = sampler.generate(state, [list(ids)], jax.random.key(0))
    got = res.completion_BxC[0, :res.lengths_B[0]].tolist()
    assert got == want, question
    # The random policy's greedy text is repetitive; the next-token distributions must agree too.
    mask = np.ones((1, len(ids)), np.int32)
    np.testing.assert_allclose(jax_logits(model, np.asarray([ids]), mask),
                               torch_logits(hf, np.asarray([ids]), mask), atol=2e-4)
  # (The random policy never emits a stop token in 24 steps; that transformers stops on every token of
  # eos_token_id is its documented behaviour, and the list is checked in the test above.)
  from transformers import GenerationConfig
  assert GenerationConfig.from_pretrained(out).eos_token_id == list(stop_ids(tokenizer))


def test_sigterm_during_the_final_export_exits_preempted_and_the_rerun_exports(tmp_path, monkeypatch):
  """The last step is saved before the export: a signal there stops at once; the same call, again, only exports."""
  import signal

  from grpo_jax import errors
  config = _exporting_config()
  write, calls = loop.write_hf_model, []

  def signalled(*args, **kwargs):
    calls.append(1)
    if len(calls) == 1:
      os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, before a file is written
    return write(*args, **kwargs)
  monkeypatch.setattr(loop, "write_hf_model", signalled)
  with pytest.raises(errors.Preempted, match="SIGTERM"):
    loop.train(config, str(tmp_path))
  assert not os.path.exists(RunFiles(str(tmp_path)).hf_model) and not (tmp_path / "summary.json").exists()
  summary = loop.train(config, str(tmp_path))
  assert summary.steps == 1 and len(calls) == 2
  assert os.path.exists(os.path.join(RunFiles(str(tmp_path)).hf_model, "config.json"))
