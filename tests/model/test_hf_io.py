"""Hugging Face checkpoints in and out, checked against transformers' PyTorch models."""
from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from grpo_jax.model import ModelConfig, Transformer, hf_io
from .helpers import SPECS, jax_logits, left_padded_batch, torch_logits
from tests.tolerance import assert_close_f32

# Compared with float64 / transformers: full float32 matmuls (TF32 by default on NVIDIA GPUs).
pytestmark = pytest.mark.usefixtures("float32_matmuls")

LENGTHS, TOTAL = (12, 9, 4), 12


@pytest.fixture(scope="module")
def batch():
  return left_padded_batch(np.random.default_rng(0), LENGTHS, TOTAL)


@pytest.mark.parametrize("name", list(SPECS))
def test_logits_match_transformers_with_left_padding(hf_checkpoints, batch, name):
  path, torch_model = hf_checkpoints[name]
  tokens, mask = batch
  model = hf_io.from_pretrained(path)
  assert model.embed_VxD[...].dtype == jnp.float32
  ours, ref = jax_logits(model, tokens, mask), torch_logits(torch_model, tokens, mask)
  np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=0)


def test_rope_scaling_changes_the_logits(hf_checkpoints, batch):
  """The llama3 comparison above can fail: ignoring the rope scaling gives clearly different logits."""
  path, torch_model = hf_checkpoints["llama3_rope_sharded"]
  tokens, mask = batch
  unscaled = hf_io.from_pretrained(path, rope_scaling=None)
  diff = np.abs(jax_logits(unscaled, tokens, mask) - torch_logits(torch_model, tokens, mask))[mask]
  assert diff.max() > 1e-2


@pytest.mark.parametrize("name,max_shard_bytes", [("qwen2_gqa_bias_tied", 4 * 2**30),
                                                  ("qwen3_qknorm_untied", 20_000),
                                                  ("llama3_rope_sharded", 4 * 2**30)])
def test_save_pretrained_round_trip_through_transformers(hf_checkpoints, batch, tmp_path, name, max_shard_bytes):
  import transformers
  path, torch_model = hf_checkpoints[name]
  model = hf_io.from_pretrained(path)
  out = tmp_path / "saved"
  hf_io.save_pretrained(model, out, source=path, max_shard_bytes=max_shard_bytes)
  sharded = (out / hf_io.INDEX_FILE).exists()
  assert sharded == (max_shard_bytes < 2**30)
  assert (out / "generation_config.json").exists()  # carried over from `source`
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  assert type(reloaded) is type(torch_model)
  original = torch_model.state_dict()
  for key, value in reloaded.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), original[key].numpy(), err_msg=key)
  tokens, mask = batch
  np.testing.assert_allclose(torch_logits(reloaded, tokens, mask)[mask],
                             jax_logits(model, tokens, mask)[mask], atol=1e-4, rtol=0)
  # And back into JAX: identical parameters.
  again = hf_io.from_pretrained(out)
  for (p, a), (q, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(again))):
    assert p == q
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(p))


def test_save_pretrained_of_a_fresh_model_loads_in_transformers(tmp_path):
  import transformers
  cfg = ModelConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2,
                    num_kv_heads=1, head_dim=8, attention_bias=True, family="qwen2", tie_word_embeddings=True)
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  hf_io.save_pretrained(model, tmp_path)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
  assert type(reloaded).__name__ == "Qwen2ForCausalLM"
  tokens, mask = left_padded_batch(np.random.default_rng(1), (5, 3), 5)
  tokens = np.minimum(tokens, 39)
  # transformers against JAX: 1.6 ulps of the largest logit seen; 512, the old atol at logits this small (~0.32).
  assert_close_f32(torch_logits(reloaded, tokens, mask)[mask], jax_logits(model, tokens, mask)[mask], ulps=512)


def test_save_pretrained_rejects_a_config_without_hf_equivalent(tmp_path):
  cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                    num_kv_heads=2, head_dim=4, qk_norm=True)  # family defaults to llama
  with pytest.raises(ValueError, match="family"):
    hf_io.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), tmp_path)


def test_bfloat16_parameters_and_compute_roughly_agree(hf_checkpoints, batch):
  path, torch_model = hf_checkpoints["qwen2_gqa_bias_tied"]
  tokens, mask = batch
  ref = torch_logits(torch_model, tokens, mask)[mask]
  model = hf_io.from_pretrained(path, param_dtype="bfloat16", dtype="bfloat16")
  leaves = [v.get_value() for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]
  assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
  hidden, _ = model(tokens, *_fwd_args(mask))
  assert hidden.dtype == jnp.bfloat16
  err = np.abs(jax_logits(model, tokens, mask)[mask] - ref)
  assert err.max() < 0.25 and err.mean() < 0.03, (err.max(), err.mean())
  mixed = hf_io.from_pretrained(path, param_dtype="float32", dtype="bfloat16")  # f32 master weights
  err_mixed = np.abs(jax_logits(mixed, tokens, mask)[mask] - ref)
  assert err_mixed.max() < 0.25 and err_mixed.mean() < 0.03, (err_mixed.max(), err_mixed.mean())
  assert err.max() > 1e-3  # it really ran in bfloat16


def test_bfloat16_model_saves_bfloat16_tensors_that_transformers_loads(hf_checkpoints, tmp_path):
  import torch
  import transformers
  path, _ = hf_checkpoints["llama3_rope_sharded"]
  model = hf_io.from_pretrained(path, param_dtype="bfloat16")
  hf_io.save_pretrained(model, tmp_path)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto")
  weight = reloaded.state_dict()["model.layers.1.mlp.down_proj.weight"]
  assert weight.dtype == torch.bfloat16
  ours = np.asarray(model.layers[1].mlp.down_FxD[...].astype(jnp.float32)).T
  np.testing.assert_array_equal(weight.float().numpy(), ours)


def _fwd_args(mask):
  from grpo_jax.model import causal_attention_mask, positions_from_mask
  return positions_from_mask(mask), causal_attention_mask(mask)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.fixture
def qwen2_copy(hf_checkpoints, tmp_path):
  """A writable copy of the tied Qwen2 checkpoint and its tensors."""
  src, _ = hf_checkpoints["qwen2_gqa_bias_tied"]
  dst = tmp_path / "ckpt"
  shutil.copytree(src, dst)
  return dst, load_file(dst / hf_io.SINGLE_FILE)


def _rewrite(path, tensors):
  save_file(tensors, str(path / hf_io.SINGLE_FILE), metadata={"format": "pt"})


def _drop_up_proj(tensors):
  del tensors["model.layers.1.mlp.up_proj.weight"]


def _add_o_proj_bias(tensors):
  tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(32, np.float32)


def _one_kv_head(tensors):
  tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)  # 1 kv head, not 2


@pytest.mark.parametrize("mutate, message", [
    (_drop_up_proj, r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"),
    (_add_o_proj_bias, r"unexpected tensors \['model.layers.0.self_attn.o_proj.bias'\]"),
    (_one_kv_head, r"model.layers.0.self_attn.k_proj.weight has shape \[8, 32\], expected \[16, 32\]"),
])
def test_a_wrong_tensor_is_named(qwen2_copy, mutate, message):
  path, tensors = qwen2_copy
  mutate(tensors)
  _rewrite(path, tensors)
  with pytest.raises(ValueError, match=message):
    hf_io.from_pretrained(path)


def test_legacy_rotary_buffers_are_ignored(qwen2_copy):
  path, tensors = qwen2_copy
  tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
  _rewrite(path, tensors)
  hf_io.from_pretrained(path)


def test_tied_lm_head_equal_is_accepted_and_different_is_an_error(qwen2_copy):
  path, tensors = qwen2_copy
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
  _rewrite(path, tensors)
  hf_io.from_pretrained(path)
  tensors["lm_head.weight"][0, 0] += 1.0
  _rewrite(path, tensors)
  with pytest.raises(ValueError, match="lm_head.weight differs"):
    hf_io.from_pretrained(path)


def test_sharded_checkpoint_with_a_missing_shard_file(hf_checkpoints, tmp_path):
  src, _ = hf_checkpoints["llama3_rope_sharded"]
  dst = tmp_path / "ckpt"
  shutil.copytree(src, dst)
  victim = sorted(dst.glob("model-*.safetensors"))[1]
  victim.unlink()
  with pytest.raises(FileNotFoundError, match=victim.name):
    hf_io.from_pretrained(dst)


@pytest.mark.parametrize("change,message", [
    (dict(model_type="mistral", architectures=["MistralForCausalLM"]), "model_type='mistral'"),
    (dict(architectures=["Qwen2ForSequenceClassification"]), "Qwen2ForSequenceClassification"),
    (dict(use_sliding_window=True), "use_sliding_window"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "sliding_attention"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(rope_parameters=dict(rope_type="longrope", factor=4.0, rope_theta=1e4)), "'longrope'"),
    (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=1e4)), "original_max_position_embeddings"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
])
def test_unsupported_configs_are_errors(qwen2_copy, change, message):
  path, _ = qwen2_copy
  config = json.loads((path / "config.json").read_text())
  config.update(change)
  (path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    hf_io.from_pretrained(path)


def test_gemma3_config_is_read_and_gemma2_names_what_is_not_implemented():
  """transformers' own Gemma 3 text config loads (the family is tested in test_gemma3.py); Gemma 2 fails with
  what differs."""
  from transformers import Gemma2Config, Gemma3TextConfig

  from grpo_jax.model.config import from_hf_config
  hf = Gemma3TextConfig(num_hidden_layers=2).to_dict()
  hf["architectures"] = ["Gemma3ForCausalLM"]
  cfg = from_hf_config(hf)
  assert cfg.family == "gemma3_text" and cfg.layer_types == ("sliding_attention",) * 2
  with pytest.raises(ValueError, match=r"'gemma2' .*is not supported yet: .*soft-capping"):
    from_hf_config(Gemma2Config(num_hidden_layers=2).to_dict())


def test_llama_attention_bias_is_unsupported():
  from grpo_jax.model import from_hf_config
  hf = dict(model_type="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
            num_attention_heads=2, attention_bias=True)
  with pytest.raises(ValueError, match="attention_bias=True"):
    from_hf_config(hf)


def test_missing_config_and_weights(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_io.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------- tokenizer


def test_load_tokenizer_from_a_local_directory(tmp_path):
  import tokenizers
  import transformers
  vocab = {"<pad>": 0, "<eos>": 1, "[UNK]": 2, "hello": 3, "world": 4, "user": 5}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="[UNK]",
      chat_template="{% for m in messages %}{{ m['role'] }} {{ m['content'] }} <eos> {% endfor %}")
  fast.save_pretrained(tmp_path)
  loaded = hf_io.load_tokenizer(tmp_path)
  assert loaded("hello world")["input_ids"] == [3, 4]
  assert loaded.pad_token_id == 0 and loaded.eos_token_id == 1
  text = loaded.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False)
  assert text == "user hello <eos> "
  with pytest.raises(FileNotFoundError, match="does-not-exist"):
    hf_io.load_tokenizer(tmp_path / "does-not-exist")


def _tokenizer_dirs():
  import os
  from grpo_jax import testing
  fixtures = testing.ensure_fixtures()
  smollm2 = os.path.join(os.path.dirname(__file__), "..", "..", "models", "SmolLM2-135M-Instruct")
  return [fixtures["checkpoint"], fixtures["gemma3_checkpoint"]] + [smollm2] * os.path.isdir(smollm2)


def _same_tokenizer(ours, auto, where):
  text = "<|im_start|>user\nWhat is 12 + 30?<|im_end|> <start_of_turn>model 42 <eos>  tabs\tand ünïcode\r\n"
  chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
  assert type(ours) is type(auto), where
  assert ours.special_tokens_map == auto.special_tokens_map and ours.get_added_vocab() == auto.get_added_vocab()
  assert ours(text)["input_ids"] == auto(text)["input_ids"], where
  assert (ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
          == auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)), where


def test_the_direct_tokenizer_load_is_autotokenizers_choice(tmp_path):
  """load_tokenizer names the class itself for a saved TokenizersBackend of a model_type it knows: the tokenizer
  must be AutoTokenizer's own (class, special tokens, ids with special tokens in the text, chat template), for the
  fixtures and SmolLM2 as they are and for the fixture's files under each model_type it knows."""
  from transformers import AutoTokenizer
  for path in _tokenizer_dirs():
    _same_tokenizer(hf_io.load_tokenizer(path), AutoTokenizer.from_pretrained(path, local_files_only=True), path)
  source = _tokenizer_dirs()[0]
  for model_type in hf_io._SAVED_BACKEND_LOADS_AS:
    shutil.copytree(source, tmp_path / model_type, ignore=shutil.ignore_patterns("*.safetensors"))
    (tmp_path / model_type / "config.json").write_text(json.dumps({"model_type": model_type}))
    path = str(tmp_path / model_type)
    _same_tokenizer(hf_io.load_tokenizer(path), AutoTokenizer.from_pretrained(path, local_files_only=True), path)


def test_a_tokenizer_of_another_class_or_model_type_or_with_its_own_code_goes_through_autotokenizer(
    tmp_path, monkeypatch):
  import transformers
  shutil.copytree(_tokenizer_dirs()[0], tmp_path / "tok", ignore=shutil.ignore_patterns("*.safetensors"))
  tok_config, config = (tmp_path / "tok" / name for name in ("tokenizer_config.json", "config.json"))
  saved, model = json.loads(tok_config.read_text()), json.loads(config.read_text())
  calls = []
  monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kw: calls.append(path))
  hf_io.load_tokenizer(tmp_path / "tok")
  assert calls == []  # a saved TokenizersBackend of a qwen2 model: loaded directly
  for change in ({"tokenizer_class": "Qwen2Tokenizer"}, {"auto_map": {"AutoTokenizer": [None, "tok.MyTok"]}}):
    tok_config.write_text(json.dumps({**saved, **change}))
    hf_io.load_tokenizer(tmp_path / "tok")
  tok_config.write_text(json.dumps(saved))
  config.write_text(json.dumps({**model, "model_type": "mistral"}))
  hf_io.load_tokenizer(tmp_path / "tok")
  config.unlink()
  hf_io.load_tokenizer(tmp_path / "tok")
  assert calls == [str(tmp_path / "tok")] * 4


def test_a_trainer_imports_no_torch():
  # AutoTokenizer's import of every model config brings torch (1.7 s of each run's start where it is installed).
  import subprocess
  import sys
  from grpo_jax import testing
  code = ("import sys, grpo_jax.train.loop; from grpo_jax.data import tasks; "
          f"tasks.load_hf_tokenizer({testing.ensure_fixtures()['checkpoint']!r}); print('torch' in sys.modules)")
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
