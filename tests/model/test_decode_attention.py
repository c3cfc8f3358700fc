"""`ModelConfig.decode_attention="pallas"` (grpo_jax/model/decode_attention.py): the kernel runs here in Pallas'
interpreter and must give numpy's attention over the filled slots; the sampler must give the einsum path's tokens
and log-probs; and the kernel must lower to Triton for CUDA at the recipes' shapes (checked on this CPU: what
only a GPU shows, its speed, is benchmarks/gpu_campaign.py's decode_pallas part)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import config as config_lib
from grpo_jax.errors import ConfigError
from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.model import decode_attention as kernel
from grpo_jax.model.config import FULL, SLIDING
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.train import checks
from tests.tolerance import assert_close_f32

# On a GPU float32 dots default to TF32 outside the kernel; the comparisons here are of float32 math.
pytestmark = pytest.mark.usefixtures("float32_matmuls")


def numpy_attention(q, k, v, key_ok, length, scale):
  """float64: q [B, K, G, H], keys [B, K, H, S], values [B, K, S, H]; zeros for a query that sees no key."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, K, G, H = q.shape
  out = np.zeros((B, K, G, H))
  for b in range(B):
    seen = [s for s in range(length) if key_ok[b, s]]
    for h in range(K):
      if seen:
        scores = q[b, h] @ k[b, h][:, seen] * scale  # [G, seen]
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[b, h] = (p / p.sum(axis=1, keepdims=True)) @ v[b, h][seen]
  return out


def _inputs(B, K, G, H, S, dtype, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=shape), dtype) for shape in ((B, K, G, H), (B, K, H, S), (B, K, S, H)))
  key_ok = rng.random((B, S)) > 0.3
  key_ok[-1] = False  # the last row sees nothing: zeros
  return q, k, v, jnp.asarray(key_ok)


@pytest.mark.parametrize("B, K, G, H, S, length, dtype", [
    (3, 2, 7, 64, 200, 150, jnp.float32),   # 7 query heads per kv head (padded to 16), a cut in a block
    (2, 1, 4, 16, 40, 40, jnp.float32),     # all slots filled; the last block runs past the cache
    (2, 2, 3, 32, 70, 5, jnp.bfloat16),     # one block, most of it unfilled
])
def test_kernel_is_numpy_attention_over_the_filled_slots(B, K, G, H, S, length, dtype):
  q, k, v, key_ok = _inputs(B, K, G, H, S, dtype)
  out = jax.jit(lambda *a: kernel.decode_attention(*a, scale=0.3))(q, k, v, key_ok, jnp.int32(length))
  assert out.dtype == dtype and out.shape == (B, K, G, H)
  want = numpy_attention(q, k, v, np.asarray(key_ok), length, 0.3)
  if dtype == jnp.float32:  # softmax-weighted sums of up to 150 values: 16 ulps of the largest |v|
    assert_close_f32(out, want, ulps=16, scale=np.abs(np.asarray(v)).max())
  else:                     # one bfloat16 rounding of outputs of size ~2
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=0, atol=2e-2)
  assert not np.any(np.asarray(out[-1]))


def test_unfilled_slots_never_reach_the_output():
  q, k, v, key_ok = _inputs(2, 2, 4, 16, 48, jnp.float32)
  length = 21
  poisoned_k = k.at[..., length:].set(jnp.inf)
  poisoned_v = v.at[:, :, length:].set(jnp.nan)
  fn = jax.jit(lambda *a: kernel.decode_attention(*a, scale=0.25))
  np.testing.assert_array_equal(np.asarray(fn(q, poisoned_k, poisoned_v, key_ok, jnp.int32(length))),
                                np.asarray(fn(q, k, v, key_ok, jnp.int32(length))))


def test_gradient_flows_through_the_reference():
  """A training forward that takes the kernel stays differentiable: its backward is the einsum reference's."""
  q, k, v, key_ok = _inputs(2, 2, 3, 16, 24, jnp.float32)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v, key_ok, 17, scale=0.25) * weights)

  got = jax.grad(loss(kernel.decode_attention), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(kernel.reference_decode_attention), argnums=(0, 1, 2))(q, k, v)
  for g, w in zip(got, want):
    assert float(jnp.max(jnp.abs(w))) > 0
    assert_close_f32(g, w, ulps=16)  # the same backward (equal here): 12 ulps the old atol


def _model(sliding: bool, decode_attention: str):
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=6, num_kv_heads=2,
                    head_dim=16, max_position_embeddings=128, decode_attention=decode_attention)
  if sliding:  # Gemma 3's layout: a sliding layer (window 6, shorter than the cache) then a global one
    cfg = dataclasses.replace(cfg, family="gemma3_text", qk_norm=True, tie_word_embeddings=True,
                              layer_types=(SLIDING, FULL), sliding_window=6, query_pre_attn_scalar=8.0)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(3))))


@pytest.mark.parametrize("sliding", [False, True])
def test_sampler_gives_the_einsum_paths_tokens_and_log_probs(sliding):
  prompts = [[5, 9, 11, 2], [7, 3], [40, 41, 42, 43, 44, 45, 46]]
  out = {}
  for name in ("einsum", "pallas"):
    graphdef, state = _model(sliding, name)
    sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=13, temperature=0.7, pad_id=0), prompt_bucket_min=8)
    out[name] = sampler.generate(state, prompts, jax.random.key(0), repeats=2)
  np.testing.assert_array_equal(out["pallas"].completion_BxC, out["einsum"].completion_BxC)
  # Two attention programs through 2 layers: 1.6 ulps of the largest |log-prob| seen, 34 the old atol.
  assert_close_f32(out["pallas"].logp_BxC, out["einsum"].logp_BxC, ulps=64)
  assert out["einsum"].lengths_B.max() == 13  # random weights: no row stops


@pytest.mark.parametrize("K, G, H, S", [(2, 7, 64, 768),    # Qwen2.5-0.5B in experiments/gsm8k.py: 256 + 512 slots
                                        (1, 4, 256, 768),   # Gemma 3 1B
                                        (2, 6, 128, 100)])  # Qwen2.5-1.5B, a cache length not a block multiple
def test_kernel_lowers_to_triton_for_cuda(K, G, H, S):
  export = pytest.importorskip("jax.export")
  sd = jax.ShapeDtypeStruct
  args = (sd((256, K, G, H), jnp.bfloat16), sd((256, K, H, S), jnp.bfloat16), sd((256, K, S, H), jnp.bfloat16),
          sd((256, S), jnp.bool_), sd((), jnp.int32))
  triton = "__gpu$xla.gpu.triton"
  fn = jax.jit(lambda *a: kernel.pallas_decode_attention(*a, scale=H ** -0.5, interpret=False))
  lowered = export.export(fn, platforms=("cuda",),
                          disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)])(*args)
  assert lowered.mlir_module().count(triton) == 1


def test_where_the_kernel_cannot_run_it_says_so():
  with pytest.raises(ValueError, match="on a TPU use decode_attention='einsum'"):
    kernel.check_supported(64, "tpu")
  with pytest.raises(ValueError, match="head_dim a power of two >= 16 on a GPU, this model has 80"):
    kernel.check_supported(80, "gpu")
  kernel.check_supported(8, "cpu")  # the interpreter takes any shape
  with pytest.raises(ValueError, match=r"decode_attention='flash': expected one of \['einsum', 'pallas'\]"):
    ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                head_dim=8, max_position_embeddings=8, decode_attention="flash")
  c = config_lib.get_config()
  c.model.decode_attention = "flash"
  with pytest.raises(ConfigError, match="model.decode_attention='flash': not one of"):
    checks.validate(c)
