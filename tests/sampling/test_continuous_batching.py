"""Continuous batching (SamplingConfig.slots): S slots decode the batch's rows, each slot taking the next
(prompt, sample) when its row stops. Row b's token t reads the static decode's uniform u[t, b] and its cache is the
static decode's row, so both decodes give the same completions, bitwise; and the utilization counters."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax.errors import ConfigError
from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.model.config import FULL, LINEAR, SLIDING
from grpo_jax.sampling import Sampler, SamplingConfig
from tests.virtual_devices import REPO, env_with_devices

V, C, G = 97, 20, 3
# 5 prompts of very different lengths, left padded to 12: 6 prompt rows in the batch bucket, B = 18 rows.
PROMPTS = [[5 + i for i in range(n)] for n in (4, 1, 11, 6, 3)]
# Near-uniform logits (random init): each step stops a row with probability ~3/97, so a few rows stop after 1-3
# tokens and many run to C.
STOPS = (5, 17, 30)
SLOTS = 4  # < B and not dividing it
EVERY = 3  # stop_check_every: a slot whose row stops mid-chunk waits for the chunk's end


def _model(kind: str):
  shape = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
               head_dim=8, max_position_embeddings=128)
  cfg = {
      "dense": ModelConfig(**shape),
      # Gemma 3's layout: a sliding layer whose window (6) is shorter than the cache, then a global one.
      "sliding": ModelConfig(**shape, family="gemma3_text", qk_norm=True, tie_word_embeddings=True,
                             layer_types=(SLIDING, FULL), sliding_window=6, query_pre_attn_scalar=8.0),
      "moe": ModelConfig(**shape, qk_norm=True, family="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=16, moe_layers=(True, False), norm_topk_prob=True),
      # Qwen3.5's hybrid: two Gated DeltaNet layers (a LinearCache per row), then full attention.
      "qwen3_5": ModelConfig(**{**shape, "num_layers": 3, "head_dim": 16}, rope_theta=1e7,
                             partial_rotary_factor=0.25, tie_word_embeddings=True, qk_norm=True,
                             attention_output_gate=True, family="qwen3_5_text", layer_types=(LINEAR, LINEAR, FULL),
                             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                             linear_value_head_dim=8),
  }[kind]
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(3))))


def _static_and_continuous(kind: str, cfg: SamplingConfig, every: int = EVERY):
  """((result, sampler) of the static decode, the same of the continuous one with SLOTS slots)."""
  graphdef, state = _model(kind)
  out = {}
  for slots in (0, SLOTS):
    sampler = Sampler(graphdef, dataclasses.replace(cfg, slots=slots), prompt_bucket_min=8, stop_check_every=every)
    out[slots] = sampler.generate(state, PROMPTS, jax.random.key(1), repeats=G), sampler
  return out[0], out[SLOTS]


def _assert_same(static, continuous):
  for field in ("prompt_BxP", "prompt_mask_BxP", "completion_BxC", "completion_mask_BxC", "logp_BxC", "lengths_B",
                "truncated_B"):
    np.testing.assert_array_equal(getattr(continuous, field), getattr(static, field), err_msg=field)


def _long_tail(lengths):
  """Rows that stop after 1-3 tokens and rows that run to C: the slots are refilled while others decode on."""
  assert lengths.min() <= 3 and lengths.max() == C and len(set(lengths.tolist())) > 3, lengths


SAMPLED = dict(temperature=1.3, top_k=9, top_p=0.8)


@pytest.fixture(scope="module")
def sampled_runs():
  return _static_and_continuous("dense", SamplingConfig(max_new_tokens=C, stop_ids=STOPS, pad_id=0, **SAMPLED))


@pytest.mark.parametrize("sampling", ["top-k, top-p", "greedy"])
def test_continuous_gives_the_static_completions_bitwise(sampling, sampled_runs):
  if sampling == "greedy":
    # A group's rows agree; stop ids from the prompts' greedy completions: lengths 3, 1, 12, 11 and 20.
    sampled_runs = _static_and_continuous("dense", SamplingConfig(max_new_tokens=C, stop_ids=(62, 39, 3), pad_id=0,
                                                                  greedy=True))
  (static, _), (continuous, sampler) = sampled_runs
  _long_tail(static.lengths_B)
  _assert_same(static, continuous)
  assert sampler.trace_counts == {"prefill": 1, "decode": 1, "prompt_rope": 1}


@pytest.mark.parametrize("kind", ["sliding", "moe", "qwen3_5"])
def test_continuous_equals_static_for_rings_experts_and_linear_attention(kind):
  (static, _), (continuous, _) = _static_and_continuous(
      kind, SamplingConfig(max_new_tokens=C, temperature=0.7, stop_ids=STOPS, pad_id=0))
  _long_tail(static.lengths_B)
  _assert_same(static, continuous)
  if kind == "moe":
    # The experts of every token fed to produce a kept token: the prompt and completion columns < length - 1.
    # After that the static decode records what its forward of masked pad tokens chose, the continuous one zeros.
    P = static.prompt_BxP.shape[1]
    fed_BxT = np.arange(P + C)[None] < P + static.lengths_B[:, None] - 1
    np.testing.assert_array_equal(continuous.experts_BxTxLxk[fed_BxT], static.experts_BxTxLxk[fed_BxT])
    assert not continuous.experts_BxTxLxk[~fed_BxT].any()


def test_pallas_decode_attention_reads_up_to_the_furthest_slot():
  """model.decode_attention="pallas" (Pallas' interpreter on a CPU): one kernel call over the slots' rows, which
  stand at different cache positions; it reads up to the furthest one and the mask hides the rest."""
  cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                    head_dim=16, max_position_embeddings=128, decode_attention="pallas")
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(3))))
  sampling = SamplingConfig(max_new_tokens=8, temperature=0.7, stop_ids=(5, 17, 30, 40, 41, 42), pad_id=0)
  static, continuous = (Sampler(graphdef, dataclasses.replace(sampling, slots=slots), prompt_bucket_min=8).generate(
      state, PROMPTS[:3], jax.random.key(1), repeats=2) for slots in (0, 2))
  assert len(set(static.lengths_B.tolist())) > 1
  _assert_same(static, continuous)


def _continuous_steps(lengths, slots: int, every: int) -> int:
  """The continuous decode's token steps, by hand: rows in order (those with tokens left after the prefill's),
  idle slots refilled in slot order every `every` steps."""
  queue, left, steps = [n - 1 for n in lengths if n > 1], [0] * slots, 0
  while queue or any(left):
    left = [queue.pop(0) if n == 0 and queue else n for n in left]
    left, steps = [max(0, n - every) for n in left], steps + every
  return steps


def test_utilization_counters_by_hand(sampled_runs):
  (static, s_sampler), (continuous, c_sampler) = sampled_runs
  lengths = static.lengths_B
  B = 6 * G  # the prompt-row bucket of 5 prompts, times G
  # The static decode: whole chunks of EVERY steps until every row stopped, at most the C - 1 after the prefill's.
  assert s_sampler.slot_steps == B * min(-(-(lengths.max() - 1) // EVERY) * EVERY, C - 1)
  assert c_sampler.slot_steps == SLOTS * _continuous_steps(lengths, SLOTS, EVERY)
  kept = int(np.sum(lengths - 1))  # every token but the prefill's
  assert s_sampler.kept_slot_steps == c_sampler.kept_slot_steps == kept
  assert c_sampler.kept_slot_steps / c_sampler.slot_steps > s_sampler.kept_slot_steps / s_sampler.slot_steps


def test_refusals():
  with pytest.raises(ConfigError, match=r"SamplingConfig.slots=4: cannot be combined with "
                                        r"SamplingConfig.decode_segment=8 .* set one of them to 0"):
    SamplingConfig(max_new_tokens=C, slots=4, decode_segment=8)
  with pytest.raises(ConfigError, match=r"slots=-1: must be >= 0"):
    SamplingConfig(max_new_tokens=C, slots=-1)
  graphdef, state = _model("dense")
  mesh = jax.sharding.AbstractMesh((2, 1, 1), ("data", "fsdp", "tensor"))
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=C, slots=3), mesh=mesh)
  with pytest.raises(ValueError, match=r"sampling.slots=3 must be a multiple of the 2 devices the batch is split "
                                       r"over \(mesh axes data/fsdp\)"):
    sampler.generate(state, PROMPTS, jax.random.key(0), repeats=G)


MESH_WORKER = """
import dataclasses, json, jax, numpy as np
from grpo_jax.model import sharding
from grpo_jax.sampling import Sampler, SamplingConfig
from tests.sampling.test_continuous_batching import G, PROMPTS, STOPS, _model
graphdef, state = _model("dense")
params = sharding.shard_state(state, sharding.make_mesh(2, 1))
cfg = SamplingConfig(max_new_tokens=20, temperature=0.7, stop_ids=STOPS, pad_id=0)
samplers = {slots: Sampler(graphdef, dataclasses.replace(cfg, slots=slots), prompt_bucket_min=8) for slots in (0, 4)}
out = {slots: s.generate(params, PROMPTS, jax.random.key(1), repeats=G) for slots, s in samplers.items()}
same = {f: bool(np.array_equal(getattr(out[0], f), getattr(out[4], f)))
        for f in ("completion_BxC", "completion_mask_BxC", "logp_BxC", "truncated_B")}
print(json.dumps(dict(same, slots_per_device=samplers[4].last_cache_sharding.shard_shape((4, 2, 8, 32))[0])))
"""


def test_two_devices_split_the_slots_and_give_the_static_completions():
  """On 2 devices (each decoding 2 of the 4 slots) the continuous decode samples what the static one samples there."""
  proc = subprocess.run([sys.executable, "-c", MESH_WORKER], env=env_with_devices(2), capture_output=True, text=True,
                        timeout=300, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result.pop("slots_per_device") == 2 and all(result.values()), result
