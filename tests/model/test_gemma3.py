"""Gemma 3 against transformers' PyTorch Gemma3ForCausalLM on the same (random) weights, float32.

The random checkpoints have the real widths of Gemma 3 1B and 4B (hidden size, MLP, heads, head_dim, 1B's
window of 512, 4B's linear RoPE scaling) with two or three layers (sliding and global) and a vocabulary of 512
instead of 262k (the output projection is the same code at any vocabulary size, and a 262k float32 embedding
would cost ~1 GB per model here). Most cases use a sliding window of 16 so that prompts of 40 tokens exercise
the window logic cheaply; one case runs 700 tokens through the real window of 512.
"""
from __future__ import annotations

import json

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from grpo_jax.model import ModelConfig, Transformer, causal_attention_mask, hf_io, init_cache, lora
from grpo_jax.model import positions_from_mask, token_logprobs
from grpo_jax.model.config import FULL, SLIDING, LinearRopeScaling, from_hf_config, to_hf_config
from grpo_jax.model.logprobs import completion_logprobs
from grpo_jax.sampling import Sampler, SamplingConfig
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

VOCAB = 512
S_, F_ = "sliding_attention", "full_attention"
# name -> Gemma3TextConfig kwargs. Widths of google/gemma-3-1b-pt and the language model of gemma-3-4b-pt.
SHAPES = {
    "1b": dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4, num_key_value_heads=1,
               head_dim=256, query_pre_attn_scalar=256, rope_parameters={
                   F_: dict(rope_type="default", rope_theta=1_000_000.0),
                   S_: dict(rope_type="default", rope_theta=10_000.0)}),
    "4b": dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=4,
               head_dim=256, query_pre_attn_scalar=256, rope_parameters={
                   F_: dict(rope_type="linear", factor=8.0, rope_theta=1_000_000.0),
                   S_: dict(rope_type="default", rope_theta=10_000.0)}),
    # Small and fast: the sampler, cache and LoRA tests.
    "tiny": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 query_pre_attn_scalar=24, rope_parameters={
                     F_: dict(rope_type="linear", factor=2.0, rope_theta=1_000_000.0),
                     S_: dict(rope_type="default", rope_theta=10_000.0)}),
}


def build_torch_gemma(shape: str, layer_types, sliding_window: int, seed: int = 0, vocab: int = VOCAB):
  import torch
  import transformers
  config = transformers.Gemma3TextConfig(vocab_size=vocab, num_hidden_layers=len(layer_types),
                                         layer_types=list(layer_types), sliding_window=sliding_window,
                                         max_position_embeddings=2048, rms_norm_eps=1e-6,
                                         attn_implementation="eager", **SHAPES[shape])
  torch.manual_seed(seed)
  model = transformers.Gemma3ForCausalLM(config).eval()
  with torch.no_grad():  # every tensor random, norm offsets non-zero, so that each one matters
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.copy_(0.3 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))
  return model


def left_padded(rng, lengths, total, vocab=VOCAB):
  tokens = rng.integers(3, vocab, size=(len(lengths), total)).astype(np.int32)
  mask = np.arange(total)[None] >= total - np.asarray(lengths)[:, None]
  tokens[:, 0] = 2  # a BOS first where a row has no padding
  for b, n in enumerate(lengths):
    tokens[b, total - n] = 2  # each row begins with BOS, as Gemma's tokenizer writes it
  return np.where(mask, tokens, 0), mask


def torch_logits(model, tokens, mask, keep: int = 0) -> np.ndarray:
  """transformers' logits as float64, on whatever device the model is (benchmarks/gemma3_precision.py: a GPU)."""
  import torch
  device = next(model.parameters()).device
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  as_t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long, device=device)
  with torch.no_grad():
    out = model(input_ids=as_t(tokens), attention_mask=as_t(mask), position_ids=as_t(positions), logits_to_keep=keep)
  return out.logits.double().cpu().numpy()


def jax_logits(model, tokens, mask, keep: int = 0) -> np.ndarray:
  @jax.jit
  def run(state, tokens, mask):
    m = nnx.merge(graphdef, state)
    hidden, _ = m(tokens, positions_from_mask(mask), causal_attention_mask(mask))
    return m.logits(hidden[:, -keep:])
  graphdef, state = nnx.split(model)
  return np.asarray(run(state, tokens, mask), np.float64)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (directory, torch model), built on first use."""
  specs = {"1b": ("1b", (S_, F_), 16), "4b": ("4b", (F_,), 16), "1b_w512": ("1b", (S_, S_), 512),
           "tiny": ("tiny", (S_, F_, S_), 4)}
  built = {}

  def get(name):
    if name not in built:
      shape, layer_types, window = specs[name]
      model = build_torch_gemma(shape, layer_types, window)
      path = tmp_path_factory.mktemp(name)
      model.save_pretrained(path)
      built[name] = (path, model)
    return built[name]
  return get


@pytest.mark.parametrize("name,lengths,total", [
    ("1b", (40, 23, 9), 40),   # longer and shorter than the window of 16, left padded
    ("4b", (40, 12), 40),      # one global layer, with linear RoPE scaling
    ("tiny", (30, 3), 30),
])
def test_logits_match_transformers(checkpoints, name, lengths, total):
  path, torch_model = checkpoints(name)
  tokens, mask = left_padded(np.random.default_rng(1), lengths, total)
  model = hf_io.from_pretrained(path)
  assert model.cfg.family == "gemma3_text"
  ours, ref = jax_logits(model, tokens, mask), torch_logits(torch_model, tokens, mask)
  err = np.abs(ours[mask] - ref[mask]).max()
  print(f"{name}: max |logit diff| {err:.2e}, max |logit| {np.abs(ref[mask]).max():.1f}")
  np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-4, rtol=0)


def test_long_prompt_through_the_real_window(checkpoints):
  """700 tokens through two sliding layers with Gemma 3 1B's window of 512 (logits of the last 64 positions,
  which see 512 keys of their 700)."""
  path, torch_model = checkpoints("1b_w512")
  tokens, mask = left_padded(np.random.default_rng(2), (700, 650), 700)
  model = hf_io.from_pretrained(path)
  ours, ref = jax_logits(model, tokens, mask, keep=64), torch_logits(torch_model, tokens, mask, keep=64)
  print(f"1b window 512, 700 tokens: max |logit diff| {np.abs(ours - ref).max():.2e}")
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
  # Without the window the logits differ: the comparison above checks the window.
  full = hf_io.from_pretrained(path, layer_types=(FULL, FULL))
  assert np.abs(jax_logits(full, tokens, mask, keep=64) - ref).max() > 1e-2


def _sampler_greedy(model, prompts, n):
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=n, greedy=True, pad_id=0), prompt_bucket_min=8)
  return sampler, sampler.generate(state, prompts, jax.random.key(0))


def torch_greedy(torch_model, prompts, n):
  """`generate`'s n greedy tokens after left-padded `prompts`, on whatever device the model is."""
  import torch
  device = next(torch_model.parameters()).device
  P = max(map(len, prompts))
  ids = np.zeros((len(prompts), P), np.int64)
  mask = np.zeros((len(prompts), P), np.int64)
  for b, p in enumerate(prompts):
    ids[b, P - len(p):], mask[b, P - len(p):] = p, 1
  with torch.no_grad():
    out = torch_model.generate(input_ids=torch.tensor(ids, device=device),
                               attention_mask=torch.tensor(mask, device=device), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None)
  return out[:, P:].cpu().numpy()


def test_greedy_64_tokens_equal_transformers_generate(checkpoints):
  """The sampler (ring-buffer caches of 4 slots in sliding layers) and transformers' generate, left padded
  prompts longer and shorter than the window (the real 270M model: test_gemma3_270m.py)."""
  path, torch_model = checkpoints("tiny")
  rng = np.random.default_rng(3)
  prompts = [[2, *rng.integers(3, VOCAB, size=n - 1)] for n in (21, 5, 13)]
  sampler, ours = _sampler_greedy(hf_io.from_pretrained(path), prompts, 64)
  assert sampler.last_num_steps == 64
  np.testing.assert_array_equal(ours.completion_BxC, torch_greedy(torch_model, prompts, 64))


def test_sliding_layers_cache_only_the_window(checkpoints):
  path, _ = checkpoints("tiny")
  cfg = hf_io.from_pretrained(path).cfg
  cache = init_cache(cfg, 2, 100)
  assert [c.k_BxKxHxS.shape[-1] for c in cache] == [4, 100, 4]
  assert [c.v_BxKxSxH.shape[2] for c in cache] == [4, 100, 4]
  assert [c.v_BxKxSxH.shape[2] for c in init_cache(cfg, 2, 3)] == [3, 3, 3]


@pytest.mark.parametrize("chunks", [(6, 1, 1, 5, 2)])
def test_cached_forward_in_chunks_equals_full_forward(checkpoints, chunks):
  """Prefill and decode in chunks of any length (1 = a decode step) over a ring of 4 slots: the same
  logits as one forward pass, with left padding."""
  path, _ = checkpoints("tiny")
  model = hf_io.from_pretrained(path)
  S = sum(chunks)
  tokens, mask = left_padded(np.random.default_rng(4), (S, S - 5, S - 8), S)
  full = jax_logits(model, tokens, mask)
  positions = np.asarray(positions_from_mask(mask))
  graphdef, state = nnx.split(model)

  @jax.jit  # one compilation per chunk length
  def run(state, tokens, positions, attn, cache, start):
    m = nnx.merge(graphdef, state)
    hidden, cache = m(tokens, positions, attn, cache, start)
    return m.logits(hidden), cache

  cache, start, got = init_cache(model.cfg, 3, S), 0, []
  for n in chunks:
    attn = (np.arange(S)[None, :] <= np.arange(start, start + n)[:, None])[None] & mask[:, None, :]
    logits, cache = run(state, tokens[:, start:start + n], positions[:, start:start + n], attn, cache,
                        jnp.int32(start))
    got.append(np.asarray(logits))
    start += n
  # Chunked through the cache against the whole forward: 4 ulps of the largest logit seen, 18 the old atol.
  assert_close_f32(np.concatenate(got, 1)[mask], full[mask], ulps=32)


def test_shared_prompt_logprobs_equal_per_row(checkpoints):
  """Log-probs through a shared prompt's (ring) cache equal the per-row forward; prompt > window."""
  path, _ = checkpoints("tiny")
  model = hf_io.from_pretrained(path)
  rng = np.random.default_rng(5)
  prompt, pmask = left_padded(rng, (7, 3), 7)
  prompt, pmask = np.repeat(prompt, 3, 0), np.repeat(pmask, 3, 0)
  graphdef, state = nnx.split(model)
  logprobs = jax.jit(lambda state, *args, repeats: completion_logprobs(
      nnx.merge(graphdef, state), *args, prompt_repeats=repeats)[0], static_argnames="repeats")
  for C in (1, 6):
    completion = rng.integers(3, VOCAB, size=(6, C)).astype(np.int32)
    args = (prompt, pmask, completion, np.ones_like(completion))
    # Shared against per-row prompts: 1.4 ulps of the largest |log-prob| seen, 11 the old atol.
    assert_close_f32(logprobs(state, *args, repeats=3), logprobs(state, *args, repeats=1), ulps=16)


@pytest.mark.parametrize("prompt_repeats", [1, 2])
def test_logprob_gradient_matches_torch_autograd(checkpoints, prompt_repeats):
  """The update's gradient: d/dW of an advantage-weighted sum of completion log-probs, through the training
  path (chunked log-probs, 3 positions a chunk; a shared prompt) against torch autograd through transformers'
  model, for every weight (the tied embedding gets its input and output parts), left-padded prompts longer
  than the window of 4."""
  import torch
  path, torch_model = checkpoints("tiny")
  rng = np.random.default_rng(6)
  prompt, pmask = left_padded(rng, (9, 5), 9)
  prompt, pmask = np.repeat(prompt, 2, 0), np.repeat(pmask, 2, 0)
  completion = rng.integers(3, VOCAB, size=(4, 7)).astype(np.int32)
  cmask = np.ones_like(completion, bool)
  cmask[1, 4:] = cmask[2, 6:] = False
  weight = np.where(cmask, rng.normal(size=completion.shape), 0.0).astype(np.float32)  # advantages per token

  model = hf_io.from_pretrained(path)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def objective(params):
    logp, _ = completion_logprobs(nnx.merge(graphdef, params, rest), prompt, pmask, completion, cmask,
                                  chunk_size=3, prompt_repeats=prompt_repeats)
    return jnp.sum(logp * weight)
  grads = dict(nnx.to_flat_state(jax.jit(jax.grad(objective))(params)))

  tokens = np.concatenate([prompt, completion], 1)
  mask = np.concatenate([pmask, np.ones_like(cmask)], 1)
  torch_model.zero_grad()
  logits = torch_model(input_ids=torch.tensor(tokens, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long),
                       position_ids=torch.tensor(np.maximum(np.cumsum(mask, 1) - 1, 0), dtype=torch.long)).logits
  logp = torch.log_softmax(logits[:, prompt.shape[1] - 1:-1], -1)
  logp = torch.gather(logp, -1, torch.tensor(completion, dtype=torch.long)[..., None])[..., 0]
  (logp * torch.tensor(weight)).sum().backward()
  ref = {name: p.grad.numpy() for name, p in torch_model.named_parameters()}
  torch_model.zero_grad()

  compared = set()
  for p, g in grads.items():
    name, kind = hf_io.hf_name(p)
    ours = hf_io._to_hf(np.asarray(g.get_value()), kind)
    scale = np.abs(ref[name]).max()
    assert scale > 0, name
    np.testing.assert_allclose(ours, ref[name], atol=1e-4 * scale, rtol=1e-3, err_msg=name)
    compared.add(name)
  assert compared == set(ref) - {"lm_head.weight"}  # tied: lm_head is embed_tokens


def test_chunked_logprobs_for_a_262k_vocabulary():
  """token_logprobs never builds [B, T, V]: its jaxpr's largest float32 array is one chunk's logits."""
  V, D, B, T, chunk = 262_144, 64, 2, 512, 64
  h = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
  w = jax.ShapeDtypeStruct((D, V), jnp.float32)
  y = jax.ShapeDtypeStruct((B, T), jnp.int32)
  jaxpr = jax.make_jaxpr(lambda h, w, y: token_logprobs(h, w, y, chunk_size=chunk))(h, w, y)

  def sizes(jx):
    for eqn in jx.eqns:
      for v in eqn.outvars:
        yield int(np.prod(v.aval.shape))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        yield from sizes(sub)
  assert max(sizes(jaxpr.jaxpr)) == B * chunk * V


def test_save_pretrained_round_trip_greedy_equal(checkpoints, tmp_path):
  import transformers
  path, torch_model = checkpoints("tiny")
  model = hf_io.from_pretrained(path)
  hf_io.save_pretrained(model, tmp_path / "out", source=path)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
  assert type(reloaded).__name__ == "Gemma3ForCausalLM"
  original = torch_model.state_dict()
  for key, value in reloaded.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), original[key].numpy(), err_msg=key)
  assert reloaded.config.layer_types == torch_model.config.layer_types
  assert reloaded.config.rope_parameters == torch_model.config.rope_parameters
  prompts = [[2, 7, 9, 11, 40, 41], [2, 5]]
  _, ours = _sampler_greedy(model, prompts, 16)
  np.testing.assert_array_equal(torch_greedy(reloaded, prompts, 16), ours.completion_BxC)
  again = hf_io.from_pretrained(tmp_path / "out")
  assert again.cfg == model.cfg


def test_multimodal_checkpoint_loads_its_language_model(checkpoints, tmp_path, caplog):
  """A Gemma3ForConditionalGeneration directory (the 4B/12B/27B layout): text weights under
  language_model.model., a vision tower that is skipped with a note."""
  path, torch_model = checkpoints("tiny")
  text = json.loads((path / "config.json").read_text())
  weights = load_file(str(path / "model.safetensors"))
  mm = {"language_model." + k: v for k, v in weights.items()}
  mm["vision_tower.vision_model.embeddings.patch_embedding.weight"] = np.zeros((4, 3, 2, 2), np.float32)
  mm["multi_modal_projector.mm_input_projection_weight"] = np.zeros((4, 64), np.float32)
  out = tmp_path / "mm"
  out.mkdir()
  save_file(mm, str(out / "model.safetensors"))
  (out / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"],
                                               "model_type": "gemma3", "text_config": text,
                                               "vision_config": {"model_type": "siglip_vision_model"}}))
  with caplog.at_level("WARNING"):
    model = hf_io.from_pretrained(out)
  assert "vision tower" in caplog.text and "(2 tensors) are skipped" in caplog.text
  tokens, mask = left_padded(np.random.default_rng(6), (9, 4), 9)
  np.testing.assert_allclose(jax_logits(model, tokens, mask)[mask], torch_logits(torch_model, tokens, mask)[mask],
                             atol=1e-4, rtol=0)


def test_hub_style_configs():
  """transformers 4.5x-style config.json (rope_theta, rope_local_base_freq, sliding_window_pattern) and the
  multimodal 4B / 27B text_config, which leaves most fields to Gemma3TextConfig's defaults."""
  one_b = from_hf_config(dict(
      architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262144, hidden_size=1152,
      intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
      query_pre_attn_scalar=256, rope_theta=1_000_000, rope_local_base_freq=10_000, rope_scaling=None,
      sliding_window=512, sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh",
      max_position_embeddings=32768, final_logit_softcapping=None, attn_logit_softcapping=None))
  assert one_b.layer_types.count(FULL) == 4 and one_b.layer_types[5] == FULL and one_b.layer_types[0] == SLIDING
  assert (one_b.sliding_window, one_b.rope_theta, one_b.local_rope_theta, one_b.rope_scaling) == (
      512, 1e6, 1e4, None)
  four_b = from_hf_config({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                           "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type":
                                           "gemma3_text", "num_hidden_layers": 34, "sliding_window": 1024,
                                           "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}})
  assert (four_b.vocab_size, four_b.num_heads, four_b.num_kv_heads, four_b.head_dim) == (262208, 8, 4, 256)
  assert four_b.rope_scaling == LinearRopeScaling(8.0) and four_b.sliding_window == 1024
  assert four_b.attention_scale == 256 ** -0.5
  twenty_seven = from_hf_config({"model_type": "gemma3", "text_config": {
      "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
      "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
      "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
      "sliding_window": 1024}})
  assert twenty_seven.attention_scale == 168 ** -0.5 and twenty_seven.head_dim == 128
  assert from_hf_config(to_hf_config(four_b)) == four_b
  with pytest.raises(ValueError, match="final_logit_softcapping"):
    from_hf_config({"model_type": "gemma3_text", "final_logit_softcapping": 30.0})


def test_lora_on_gemma_starts_at_the_base(checkpoints):
  path, _ = checkpoints("tiny")
  model = hf_io.from_pretrained(path)
  tokens, mask = left_padded(np.random.default_rng(7), (9, 5), 9)
  base = jax_logits(model, tokens, mask)
  lora.add_adapters(model, lora.LoraConfig(rank=2, alpha=4.0), rngs=nnx.Rngs(0))
  # On a GPU the extra x @ A @ B (zero) changes the float32 rounding of x @ W by ~2e-6 (H200, 2026-11-26), ~4 ulps
  # of the largest logit; equal here. 32 ulps: the old atol 1e-5.
  assert_close_f32(jax_logits(model, tokens, mask), base, ulps=32)
  adapters = nnx.state(model, nnx.LoRAParam)
  assert len(jax.tree.leaves(adapters)) == 2 * 7 * model.cfg.num_layers


def test_sharding_rules_cover_every_gemma_parameter(checkpoints):
  from grpo_jax.model import sharding
  path, _ = checkpoints("tiny")
  abstract = nnx.eval_shape(lambda: Transformer(hf_io.from_pretrained(path).cfg, rngs=nnx.Rngs(0)))
  mesh = sharding.make_mesh(data=1, devices=jax.devices()[:1])
  for p, v in nnx.to_flat_state(nnx.state(abstract)):
    assert v.get_metadata().get("out_sharding"), p
  sharding.param_shardings(nnx.state(abstract), mesh)
