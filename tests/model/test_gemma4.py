"""Gemma 4 (text) against transformers' PyTorch Gemma4ForCausalLM on the same random weights, float32: logits with
left padding, greedy decoding through the sampler's ring and shared caches, cached chunks, export, the multimodal
checkpoint's language model, and config.json in its two forms (hub's global_head_dim, saved per_layer_config)."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from grpo_jax.model import hf_io, positions_from_mask
from grpo_jax.model.config import FULL, SLIDING, ProportionalRope, from_hf_config, to_hf_config
from grpo_jax.model.transformer import init_cache
from tests.tolerance import assert_close_f32
from .helpers import jitted_logits as jax_logits, left_padded_batch, saved_on_first_use
from .test_gemma3 import _sampler_greedy, torch_greedy

pytestmark = pytest.mark.usefixtures("float32_matmuls")

VOCAB = 128
S_, F_ = SLIDING, FULL
# name -> Gemma4TextConfig kwargs. Windows of 4, 5 and 3 (shorter than the 20-token batches); global layers with
# their own head_dim (32 against 16) and one kv head, or the sliding layers' geometry; per-layer inputs on and off;
# the last 2 layers sharing keys/values (with and without per-layer inputs) or none; attention_k_eq_v on and off;
# proportional RoPE (with factor 2, and the default 0.25 of 512 -> 64) or the default one on full layers;
# double-wide MLPs of the shared layers; soft-capping 30, 10 or none; tied and untied embeddings; the expert block
# (4 experts, k 2) beside every layer's MLP.
SHAPES = {
    "ple_share_keqv": dict(
        num_hidden_layers=6, layer_types=[S_, S_, F_, S_, S_, F_], num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=4,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=2,
        use_double_wide_mlp=True, final_logit_softcapping=30.0,
        rope_parameters={S_: dict(rope_type="default", rope_theta=10_000.0),
                         F_: dict(rope_type="proportional", partial_rotary_factor=0.25, rope_theta=1e6, factor=2.0)}),
    "global_dim_untied": dict(  # layer_types and rope_parameters from Gemma4TextConfig's defaults: S S S F
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        sliding_window=5, hidden_size_per_layer_input=0, tie_word_embeddings=False),
    # num_kv_shared_layers without per-layer inputs: transformers 5.23 fails on its multi-token forwards
    # (_maybe_slice_kv_shared_inputs subscripts per_layer_inputs=None) unless output_hidden_states=True, which
    # skips that path, so this one is compared on logits only (`torch_logits`), not with generate.
    "share_keqv_flat": dict(
        num_hidden_layers=5, layer_types=[S_, F_, S_, S_, F_], num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=3,
        hidden_size_per_layer_input=0, num_kv_shared_layers=2, final_logit_softcapping=10.0,
        rope_parameters={S_: dict(rope_type="default", rope_theta=10_000.0),
                         F_: dict(rope_type="default", rope_theta=100_000.0)}),
    "experts_ple_share": dict(
        num_hidden_layers=4, layer_types=[S_, F_, S_, F_], num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, global_head_dim=32, sliding_window=4, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=2, final_logit_softcapping=30.0,
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24),
}


def build_torch_gemma4(name: str, seed: int = 0):
  import torch
  import transformers
  config = transformers.Gemma4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                         max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=0,
                                         eos_token_id=1, bos_token_id=2, attn_implementation="eager",
                                         **SHAPES[name])
  torch.manual_seed(seed)
  model = transformers.Gemma4ForCausalLM(config).eval()
  with torch.no_grad():  # every tensor random: norm weights and layer scalars around 1, matrices ~ 1/sqrt(fan in)
    scalars = [b for n, b in model.named_buffers() if n.endswith("layer_scalar")]
    for pname, p in list(model.named_parameters()) + [("layer_scalar", b) for b in scalars]:
      if p.ndim == 1:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))
  return model


def torch_logits(model, tokens, mask) -> np.ndarray:
  import torch
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  as_t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  with torch.no_grad():  # output_hidden_states: `share_keqv_flat`'s workaround (above), no effect on the logits
    out = model(input_ids=as_t(tokens), attention_mask=as_t(mask), position_ids=as_t(positions),
                output_hidden_states=True)
  return out.logits.double().numpy()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (directory, torch model, our model loaded from it), built on first use."""
  saved = saved_on_first_use(tmp_path_factory, build_torch_gemma4)
  ours = {}

  def get(name):
    path, model = saved(name)
    if name not in ours:
      ours[name] = hf_io.from_pretrained(path)
    return path, model, ours[name]
  return get


def batch(seed=1):
  """20 tokens, left padded to 20, 13 and 6 real ones."""
  return left_padded_batch(np.random.default_rng(seed), (20, 13, 6), 20)


@pytest.mark.parametrize("name", list(SHAPES))
def test_logits_match_transformers_with_left_padding(checkpoints, name):
  path, torch_model, model = checkpoints(name)
  cfg = model.cfg
  assert cfg.family == "gemma4_text" and list(cfg.types) == torch_model.config.layer_types
  for i in range(cfg.num_layers):  # transformers' per-layer geometry
    layer = torch_model.config.per_layer_config[i]
    assert (cfg.layer_head_dim(i), cfg.layer_kv_heads(i)) == (layer.head_dim, layer.num_key_value_heads)
  assert [cfg.kv_source(i) is not None for i in range(cfg.num_layers)] == [
      m == "reuse" for m in torch_model.config.kv_sharing_modes]
  tokens, mask = batch()
  ours, ref = jax_logits(model, tokens, mask), torch_logits(torch_model, tokens, mask)
  err = np.abs(ours[mask] - ref[mask]).max()
  print(f"{name}: max |logit diff| {err:.2e}, max |logit| {np.abs(ref[mask]).max():.1f}")
  np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=0)
  assert from_hf_config(to_hf_config(cfg)) == cfg


@pytest.mark.parametrize("name", ["ple_share_keqv", "global_dim_untied"])
def test_greedy_32_tokens_equal_transformers_generate(checkpoints, name):
  """The sampler's prefill then decode on ring buffers (sliding layers) and no cache at all for the shared layers,
  prompts left padded from 3 to 11 tokens, longer and shorter than the windows."""
  _, torch_model, model = checkpoints(name)
  rng = np.random.default_rng(3)
  prompts = [[2, *rng.integers(3, VOCAB, size=n - 1)] for n in (11, 3, 7)]
  sampler, ours = _sampler_greedy(model, prompts, 32)
  assert sampler.last_num_steps == 32
  np.testing.assert_array_equal(ours.completion_BxC, torch_greedy(torch_model, prompts, 32))


def test_cache_shapes_per_layer(checkpoints):
  """Sliding layers: a ring of the window; global layers: their own kv heads and head_dim; shared layers: none."""
  cfg = checkpoints("ple_share_keqv")[2].cfg
  cache = init_cache(cfg, 2, 100)
  assert [c if c is None else c.k_BxKxHxS.shape for c in cache] == [
      (2, 2, 16, 4), (2, 2, 16, 4), (2, 1, 32, 100), (2, 2, 16, 4), None, None]
  assert [c if c is None else c.v_BxKxSxH.shape for c in cache][2] == (2, 1, 100, 32)


def test_cached_chunks_equal_the_full_forward(checkpoints):
  """Prefill and decode in chunks (7 tokens on an empty ring, 1 token steps, then 7 over a wrapped ring; two
  compilations): the shared layers attend to their producers' ring + new keys as in one forward pass, left padded."""
  _, _, model = checkpoints("ple_share_keqv")
  tokens, mask = batch(4)
  S = tokens.shape[1]
  full = jax_logits(model, tokens, mask)
  positions = np.asarray(positions_from_mask(mask))
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tokens, positions, attn, cache, start):
    m = nnx.merge(graphdef, state)
    hidden, cache = m(tokens, positions, attn, cache, start)
    return m.logits(hidden), cache

  cache, start, got = init_cache(model.cfg, 3, S), 0, []
  for n in (7, 1, 1, 7, 1, 1, 1, 1):
    attn = (np.arange(S)[None, :] <= np.arange(start, start + n)[:, None])[None] & mask[:, None, :]
    logits, cache = run(state, tokens[:, start:start + n], positions[:, start:start + n], attn, cache,
                        jnp.int32(start))
    got.append(np.asarray(logits))
    start += n
  # 256 ulps of the largest logit (4.4e-5, ~90 ulps, seen): 20 tokens through 6 layers of unscaled attention (unit-RMS
  # q and k, scores up to ~head_dim) amplify float32 rounding; with float64 everywhere (norms, softmax and rotary
  # tables included) the chunks and the full forward agree to 1e-13.
  assert_close_f32(np.concatenate(got, 1)[mask], full[mask], ulps=256)


def test_export_loads_in_transformers_to_the_same_logits(checkpoints, tmp_path):
  """save_pretrained's checkpoint: transformers builds a Gemma4ForCausalLM with the same tensors (layer scalars,
  per-layer inputs, no k/v in the shared layers) and config, whose logits are bit for bit the original's."""
  import transformers
  for name in ("ple_share_keqv", "global_dim_untied", "experts_ple_share"):
    path, torch_model, model = checkpoints(name)
    hf_io.save_pretrained(model, tmp_path / name, source=path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name, attn_implementation="eager").eval()
    assert type(reloaded).__name__ == "Gemma4ForCausalLM"
    original = torch_model.state_dict()
    assert set(reloaded.state_dict()) == set(original)
    for key, value in reloaded.state_dict().items():
      np.testing.assert_array_equal(value.numpy(), original[key].numpy(), err_msg=key)
    for key in ("layer_types", "rope_parameters", "kv_sharing_modes", "final_logit_softcapping"):
      assert getattr(reloaded.config, key) == getattr(torch_model.config, key), key
    tokens, mask = batch(5)
    np.testing.assert_array_equal(torch_logits(reloaded, tokens, mask), torch_logits(torch_model, tokens, mask))
    assert hf_io.from_pretrained(tmp_path / name).cfg == model.cfg


def test_multimodal_checkpoint_loads_its_language_model(checkpoints, tmp_path):
  """Gemma4ForConditionalGeneration's layout (every published Gemma 4): text weights under model.language_model.,
  towers skipped; the shared layers' k/v tensors, which transformers ignores, ignored too."""
  path, torch_model, model = checkpoints("ple_share_keqv")
  weights = load_file(str(path / "model.safetensors"))
  mm = {"model.language_model." + k[len("model."):]: v for k, v in weights.items()}
  mm["model.vision_tower.patch_embedder.input_proj.weight"] = np.zeros((4, 3), np.float32)
  mm["model.embed_vision.embedding_projection.weight"] = np.zeros((64, 4), np.float32)
  mm["model.language_model.layers.5.self_attn.k_proj.weight"] = np.zeros((32, 64), np.float32)
  (tmp_path / "mm").mkdir()
  save_file(mm, str(tmp_path / "mm" / "model.safetensors"))
  text = json.loads((path / "config.json").read_text())
  (tmp_path / "mm" / "config.json").write_text(json.dumps({
      "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
      "vision_config": {"model_type": "gemma4_vision"}}))
  loaded = hf_io.from_pretrained(tmp_path / "mm")
  assert loaded.cfg == model.cfg
  tokens, mask = batch(6)
  np.testing.assert_array_equal(jax_logits(loaded, tokens, mask), jax_logits(model, tokens, mask))


def _geometry(cfg):
  return [(cfg.layer_head_dim(i), cfg.layer_kv_heads(i)) for i in range(cfg.num_layers)]


@pytest.mark.parametrize("extra", [
    {},                                                                   # global_head_dim's default 512
    dict(global_head_dim=64, num_global_key_value_heads=1),               # ignored without attention_k_eq_v
    dict(global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True),
    dict(per_layer_config={}),                                            # explicit: no overrides
    dict(per_layer_config={"05": {"head_dim": 128}, "11": {"head_dim": 128}}, global_head_dim=64),
])
def test_config_json_forms_read_as_transformers_reads_them(extra):
  """The hub's flat form and the saved per_layer_config: each layer's geometry and layer types as transformers'
  Gemma4TextConfig gives them (layer_types left out: 5:1 with the last layer forced full)."""
  import transformers
  hf = dict(model_type="gemma4_text", num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
            head_dim=32, hidden_size=128, intermediate_size=256, vocab_size=1000, hidden_size_per_layer_input=16,
            **extra)
  ref = transformers.Gemma4TextConfig(**{k: v for k, v in hf.items() if k != "model_type"})
  cfg = from_hf_config(hf)
  assert list(cfg.types) == ref.layer_types and cfg.types[5] == cfg.types[11] == FULL
  assert _geometry(cfg) == [(ref.per_layer_config[i].head_dim, ref.per_layer_config[i].num_key_value_heads)
                            for i in range(12)]
  assert cfg.rope_scaling == ProportionalRope(0.25) and (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
  assert (cfg.per_layer_input_size, cfg.per_layer_input_vocab_size, cfg.sliding_window) == (16, 262_144, 512)
  assert from_hf_config(to_hf_config(cfg)) == cfg
  multimodal = from_hf_config({"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                               "text_config": hf})
  assert multimodal == cfg and multimodal.tie_word_embeddings


@pytest.mark.parametrize("extra,named", [
    (dict(layer_types=["sliding_attention", "chunked_attention"]), "chunked_attention"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    (dict(enable_moe_block=True), "enable_moe_block"),                    # without its experts' sizes
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
    (dict(per_layer_config={"1": {"intermediate_size": 64}}), "intermediate_size"),
    (dict(rope_parameters={F_: dict(rope_type="yarn", factor=2.0, rope_theta=1e6),
                           S_: dict(rope_type="default", rope_theta=1e4)}), "yarn"),
    (dict(num_kv_shared_layers=1, layer_types=[S_, F_]), "num_kv_shared_layers"),
    (dict(attention_bias=True), "attention_bias"),
])
def test_what_is_not_reproduced_is_refused_by_name(extra, named):
  hf = dict(model_type="gemma4_text", num_hidden_layers=2, hidden_size=32, intermediate_size=64, vocab_size=100,
            **extra)
  with pytest.raises(ValueError, match=named):
    from_hf_config(hf)
