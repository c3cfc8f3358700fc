"""`cast_for_compute`: the weights cast once to the compute dtype give the forward bitwise the same values as the
float32 master weights it casts at each use, for prefill into a cache and a one-token decode step (what the
sampler's decode loop runs on the cast weights)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import Transformer
from grpo_jax.model.config import FULL, SLIDING, ModelConfig
from grpo_jax.model.lora import LoraConfig, add_adapters
from grpo_jax.model.logprobs import positions_from_mask
from grpo_jax.model.transformer import cast_for_compute, init_cache

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_heads=4, head_dim=16, param_dtype="float32",
             dtype="bfloat16", tie_word_embeddings=True)
CONFIGS = {
    "qwen2_bias": ModelConfig(num_layers=2, num_kv_heads=2, attention_bias=True, family="qwen2", **SHAPE),
    "gemma3_sliding": ModelConfig(num_layers=3, num_kv_heads=1, qk_norm=True, family="gemma3_text",
                                  sliding_window=4, layer_types=(SLIDING, SLIDING, FULL), **SHAPE),
}


def random_model(cfg: ModelConfig, lora: bool):
  """Every parameter random (norm scales around 1, biases and adapters non-zero), so each one matters."""
  model = Transformer(cfg, rngs=nnx.Rngs(params=0))
  if lora:
    add_adapters(model, LoraConfig(rank=4, alpha=8.0), nnx.Rngs(params=1))
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  leaves = [(1.0 + 0.3 * jax.random.normal(k, x.shape) if x.ndim == 1 else 0.2 * jax.random.normal(k, x.shape))
            .astype(x.dtype) for k, x in zip(keys, leaves)]
  return graphdef, jax.tree.unflatten(treedef, leaves)


def prefill_and_step(graphdef, state, tokens_BxT, mask_BxT):
  """Hidden states of a prefill into a cache, then the logits of one decode step on its cache."""
  model = nnx.merge(graphdef, state)
  B, T = tokens_BxT.shape
  S = T + 4
  cache = init_cache(model.cfg, B, S)
  attn = (jnp.arange(S)[None, :] <= jnp.arange(T)[:, None])[None] & jnp.pad(mask_BxT, ((0, 0), (0, 4)))[:, None]
  hidden, cache = model(tokens_BxT, positions_from_mask(mask_BxT), attn, cache, 0)
  step_attn = (jnp.arange(S)[None, None, :] <= T) & jnp.pad(mask_BxT, ((0, 0), (0, 4)), constant_values=True)[:, None]
  positions = jnp.sum(mask_BxT, axis=1, keepdims=True)
  step_hidden, _ = model(tokens_BxT[:, -1:], positions, step_attn, cache, T)
  return hidden, model.logits(step_hidden)


@pytest.mark.parametrize("name, lora", [("qwen2_bias", False), ("gemma3_sliding", True)])
def test_cast_weights_give_the_forward_the_same_values(name, lora):
  cfg = CONFIGS[name]
  graphdef, state = random_model(cfg, lora)
  cast = cast_for_compute(state, cfg)
  for before, after in zip(jax.tree.leaves(state), jax.tree.leaves(cast)):
    assert after.dtype == (jnp.bfloat16 if before.ndim >= 2 else jnp.float32)
  tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, cfg.vocab_size)
  mask = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)  # left padding in row 0
  run = jax.jit(prefill_and_step, static_argnums=0)
  for want, got in zip(run(graphdef, state, tokens, mask), run(graphdef, cast, tokens, mask)):
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_float32_compute_keeps_the_state_and_a_wrong_cast_would_show():
  cfg = CONFIGS["qwen2_bias"]
  graphdef, state = random_model(cfg, lora=False)
  f32 = cfg.replace(dtype="float32")
  assert cast_for_compute(state, f32) is state
  # The check above can fail: casting the norm scales too changes the values (norms run in float32).
  all_cast = jax.tree.map(lambda x: x.astype(jnp.bfloat16), state)
  tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, cfg.vocab_size)
  mask = jnp.ones((2, 6), bool)
  want, _ = prefill_and_step(graphdef, state, tokens, mask)
  got, _ = prefill_and_step(graphdef, all_cast, tokens, mask)
  assert not np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_the_sampler_decode_loop_carries_no_float32_matrix():
  """The sampler casts before its decode loop: the loop's carried values hold the weights in bfloat16, so each
  token step reads half the bytes (lowered program; the check fails when the cast is left inside the loop)."""
  from grpo_jax.sampling.config import SamplingConfig
  from grpo_jax.sampling.sampler import Sampler
  cfg = CONFIGS["qwen2_bias"]
  graphdef, state = random_model(cfg, lora=False)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=8))
  lowered, decode = [], sampler._decode

  def keep_lowered(*args, **kwargs):
    lowered.append(decode.lower(*args, **kwargs).as_text())
    return decode(*args, **kwargs)

  sampler._decode = keep_lowered
  sampler.generate(state, [[1, 2, 3]], jax.random.key(0), repeats=2)
  loops = [line for line in lowered[0].splitlines() if "stablehlo.while" in line]
  mlp = f"{cfg.hidden_size}x{cfg.intermediate_size}"  # the gate/up projections' shape
  assert loops and any(f"{mlp}xbf16" in line for line in loops)
  assert not any(f"{mlp}xf32" in line for line in loops)
