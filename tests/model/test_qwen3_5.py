"""Qwen3.5 and Qwen3.5-MoE (hybrid Gated DeltaNet / full attention) against transformers' PyTorch model on the same
random weights: logits with left padding, greedy decoding through the sampler's recurrent caches, export, the multimodal
checkpoint's language model, and the training paths (shared-prompt forward, LoRA on the linear layers)."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from grpo_jax.model import Transformer, hf_io, lora
from grpo_jax.model.config import FULL, LINEAR, from_hf_config
from grpo_jax.model.linear_attention import LinearCache
from grpo_jax.model.transformer import init_cache
from .helpers import VOCAB, jitted_logits as jax_logits, left_padded_batch, saved_on_first_use, torch_logits
from .test_gemma3 import _sampler_greedy, torch_greedy

pytestmark = pytest.mark.usefixtures("float32_matmuls")

# name -> (Qwen3_5TextConfig kwargs, left-padded row lengths). Full-attention intervals 4, 2 and 3; value heads 2x,
# 1x and 4x the key heads; key dims above, equal to and below the value dims; convolutions of 4, 2 and 3 taps;
# partial RoPE 0.25, 0.5 and 1; untied and tied embeddings; a 70-token batch spans two 64-token chunks.
SHAPES = {
    "i4_v2x_k4": (dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=8), (20, 13, 6)),
    "i2_v1x_k2_tied_long": (dict(num_hidden_layers=4, layer_types=[LINEAR, FULL] * 2, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
                                 linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=2,
                                 tie_word_embeddings=True,
                                 rope_parameters=dict(rope_type="default", rope_theta=1000.0,
                                                      partial_rotary_factor=0.5)), (70, 41, 9)),
    "i3_v4x_k3": (dict(num_hidden_layers=3, full_attention_interval=3, num_attention_heads=4, num_key_value_heads=4,
                       head_dim=8, linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=4, linear_conv_kernel_dim=3,
                       rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0)),
                  (20, 2, 11)),
    # Qwen3.5-MoE: every feed-forward 6 experts, 2 per token, beside a gated shared expert of 24 units.
    "moe_e6k2_shared": (dict(layer_types=[LINEAR, FULL, LINEAR], num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8, num_experts=6, num_experts_per_tok=2,
                             moe_intermediate_size=16, shared_expert_intermediate_size=24), (20, 13, 6)),
}


def build_torch_qwen3_5(name: str, seed: int = 0):
  import torch
  import transformers
  kw, _ = SHAPES[name]
  moe = "num_experts" in kw
  config = getattr(transformers, "Qwen3_5MoeTextConfig" if moe else "Qwen3_5TextConfig")(
      vocab_size=VOCAB, hidden_size=32, attn_implementation="eager", **kw, **({} if moe else {"intermediate_size": 48}))
  torch.manual_seed(seed)
  model = getattr(transformers, "Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM")(config).eval()
  randomize(model)
  return model


def randomize(model):
  """Every tensor random: norms (stored as offsets from 1) around 0, the gated norm around 1, decay rates
  exp(A_log) in [0.5, 4.5]."""
  import torch
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if pname.endswith("A_log"):
        p.copy_(torch.log(0.5 + 4 * torch.rand_like(p)))
      elif p.ndim == 1:
        p.copy_((1.0 if pname.endswith("linear_attn.norm.weight") else 0.0) + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (directory, torch model), built on first use."""
  return saved_on_first_use(tmp_path_factory, build_torch_qwen3_5)


@pytest.mark.parametrize("name", list(SHAPES))
def test_logits_match_transformers_with_left_padding(checkpoints, name):
  path, torch_model = checkpoints(name)
  lengths = SHAPES[name][1]
  tokens, mask = left_padded_batch(np.random.default_rng(0), lengths, max(lengths))
  model = hf_io.from_pretrained(path)
  assert model.cfg.family == type(torch_model.config).model_type and model.cfg.has_linear
  assert list(model.cfg.layer_types) == torch_model.config.layer_types
  np.testing.assert_allclose(jax_logits(model, tokens, mask)[mask], torch_logits(torch_model, tokens, mask)[mask],
                             atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["i4_v2x_k4", "moe_e6k2_shared"])
def test_greedy_32_tokens_equal_transformers_generate(checkpoints, name):
  """The sampler's prefill (chunked form, G = 1) then decode (recurrent form) on fixed-size linear caches, KV caches on
  the full layers, prompts left-padded from 3 to 11 tokens."""
  path, torch_model = checkpoints(name)
  rng = np.random.default_rng(3)
  prompts = [list(rng.integers(1, VOCAB, size=n)) for n in (11, 3, 7)]
  sampler, ours = _sampler_greedy(hf_io.from_pretrained(path), prompts, 32)
  assert sampler.last_num_steps == 32
  np.testing.assert_array_equal(ours.completion_BxC, torch_greedy(torch_model, prompts, 32))


def test_the_linear_layers_cache_does_not_grow_with_the_sequence(checkpoints):
  cfg = hf_io.from_pretrained(checkpoints("i4_v2x_k4")[0]).cfg
  short, long = init_cache(cfg, 2, 16), init_cache(cfg, 2, 4096)
  for i, (a, b) in enumerate(zip(short, long)):
    if cfg.is_linear(i):
      assert isinstance(a, LinearCache) and jax.tree.map(jnp.shape, a) == jax.tree.map(jnp.shape, b)
      assert a.conv_BxKm1xC.shape == (2, 3, 2 * 2 * 8 + 4 * 8) and a.state_BxHvxDkxDv.shape == (2, 4, 8, 8)
    else:
      assert a.v_BxKxSxH.shape[2] == 16 and b.v_BxKxSxH.shape[2] == 4096


@pytest.mark.parametrize("name", ["i2_v1x_k2_tied_long", "moe_e6k2_shared"])
def test_export_loads_in_transformers_to_the_same_logits(checkpoints, tmp_path, name):
  import transformers
  path, torch_model = checkpoints(name)
  model = hf_io.from_pretrained(path)
  hf_io.save_pretrained(model, tmp_path, source=path, max_shard_bytes=20_000)  # sharded: 2 files at least
  assert len(list(tmp_path.glob("model-*.safetensors"))) >= 2
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
  assert type(back) is type(torch_model)
  tokens, mask = left_padded_batch(np.random.default_rng(1), (12, 5), 12)
  np.testing.assert_array_equal(torch_logits(back, tokens, mask), torch_logits(torch_model, tokens, mask))
  assert from_hf_config(hf_io.read_hf_config(tmp_path)) == model.cfg


def test_multimodal_checkpoint_loads_its_language_model(tmp_path, caplog):
  """A Qwen3_5ForConditionalGeneration directory (every published Qwen3.5): the text weights under
  model.language_model., a vision tower and a multi-token-prediction head that are skipped."""
  import transformers
  text_kw = dict(SHAPES["i4_v2x_k4"][0], vocab_size=VOCAB, hidden_size=32, intermediate_size=48)
  config = transformers.Qwen3_5Config(text_config=text_kw, vision_config=dict(
      depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=2,
      temporal_patch_size=1, spatial_merge_size=1))
  mm = transformers.Qwen3_5ForConditionalGeneration(config).eval()
  randomize(mm)
  mm.save_pretrained(tmp_path)
  weights = load_file(str(tmp_path / "model.safetensors"))
  save_file({**weights, "mtp.fc.weight": np.zeros((32, 64), np.float32)}, str(tmp_path / "model.safetensors"))
  # The same language model as a causal LM, by transformers' own renaming (language_model prefix removed).
  text = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**text_kw, attn_implementation="eager"))
  text.load_state_dict({k.replace("model.language_model.", "model."): v for k, v in mm.state_dict().items()
                        if "visual" not in k})
  with caplog.at_level("WARNING"):
    model = hf_io.from_pretrained(tmp_path)
  assert "multi-token prediction" in caplog.text
  tokens, mask = left_padded_batch(np.random.default_rng(6), (9, 4), 9)
  np.testing.assert_allclose(jax_logits(model, tokens, mask)[mask], torch_logits(text.eval(), tokens, mask)[mask],
                             atol=1e-4, rtol=0)


def test_lora_on_the_linear_layers_starts_at_the_base_and_merges(checkpoints):
  base = hf_io.from_pretrained(checkpoints("i3_v4x_k3")[0])
  tokens, mask = left_padded_batch(np.random.default_rng(2), (8, 5), 8)
  expected = jax_logits(base, tokens, mask)
  config = lora.LoraConfig(rank=2, alpha=4.0, targets=("in_proj_qkv", "in_proj_z", "out_proj", "q_proj"))
  model = lora.add_adapters(base, config, nnx.Rngs(1))
  assert model.layers[0].attn.adapters.names == ("in_proj_qkv", "in_proj_z", "out_proj")
  assert model.layers[2].attn.adapters.names == ("q_proj",)
  np.testing.assert_array_equal(jax_logits(model, tokens, mask), expected)
  graphdef, params = nnx.split(model)
  adapters, rest = lora.split_adapters(params)
  keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(adapters))))
  adapted = nnx.merge(graphdef, lora.join(jax.tree.map(
      lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), adapters), rest))
  moved = jax_logits(adapted, tokens, mask)
  assert np.abs(moved - expected)[mask].max() > 1e-2  # every adapter reaches the output
  np.testing.assert_allclose(jax_logits(lora.merged(adapted), tokens, mask)[mask], moved[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("hf,message", [
    (dict(model_type="qwen3_5_text", layer_types=["linear_attention", "mamba"]), "layer_types.*mamba"),
    (dict(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"]), "Qwen3.5 and Qwen3.5-MoE are supported"),
])
def test_unsupported_layer_kinds_and_siblings_are_named(hf, message):
  base = dict(architectures=["Qwen3_5ForCausalLM"], vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
  with pytest.raises(ValueError, match=message):
    from_hf_config({**base, **hf})


def test_groups_and_decode_segments_sample_what_the_cache_free_forward_gives(checkpoints):
  """Grouped prefill (each prompt's linear states copied to its G rows), decode segments (the KV caches grow, the
  linear ones stay): the tokens of the G-times repeated prompts, with the log-probs a forward without any cache
  gives (the chunked form over prompt + completion against the prefill and the recurrent steps)."""
  from grpo_jax.sampling import Sampler, SamplingConfig
  from tests.sampling.conftest import random_prompts, teacher_forced_logits
  model = hf_io.from_pretrained(checkpoints("i3_v4x_k3")[0])
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=8, temperature=1.0, decode_segment=4))
  prompts = random_prompts(np.random.default_rng(5), [3, 11, 6], VOCAB)
  G = 3
  grouped = sampler.generate(state, prompts, jax.random.key(3), repeats=G)
  repeated = sampler.generate(state, [p for p in prompts for _ in range(G)], jax.random.key(3))
  np.testing.assert_array_equal(grouped.completion_BxC, repeated.completion_BxC)
  assert len({tuple(r) for r in grouped.completion_BxC[:G]}) > 1
  logits = teacher_forced_logits(model, grouped)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
      -1, keepdims=True)
  expected = np.take_along_axis(logp, grouped.completion_BxC[..., None], axis=-1)[..., 0]
  real = grouped.completion_mask_BxC > 0
  np.testing.assert_allclose(grouped.logp_BxC[real], expected[real], atol=1e-4, rtol=0)
