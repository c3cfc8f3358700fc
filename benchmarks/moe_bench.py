#!/usr/bin/env python
"""A mixture-of-experts model's decode and update time against a dense model of the same active size.

  .venv/bin/python benchmarks/moe_bench.py
  .venv/bin/python benchmarks/moe_bench.py --experts 16 --k 2 --rows 64 --new-tokens 128

The dense baseline has MLPs of k x F units; the MoE model has E experts of F units, k per token (the same FLOPs per
token in its experts, E / k times the expert parameters). Both: D=256, 4 layers, 8 heads, vocabulary 1024. Timed
after one compiling call, alternately, medians of --repeats:
  decode:  the sampler (grouped prefill + KV-cache decode) on --rows rows x --new-tokens tokens, greedy.
  update:  one forward and backward of the summed completion log-probs over --rows rows x (32 + --new-tokens).
The MoE model runs three times: moe_impl "ragged" (jax.lax.ragged_dot over tokens sorted by expert: "auto" off
CPUs), "blocks" (per-expert blocks of rows, one batched matmul: "auto" on CPUs) and "dense" (every expert on every
token, the reference). XLA:CPU expands ragged_dot into a masked product over every expert, so on a CPU "ragged"
costs about what "dense" does; TPUs (and GPUs where XLA lowers it to a grouped GEMM) run only the routed rows.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--experts", type=int, default=8)
  parser.add_argument("--k", type=int, default=2)
  parser.add_argument("--expert-size", type=int, default=256, help="F: one expert's hidden units")
  parser.add_argument("--rows", type=int, default=32)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)

  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from grpo_jax.model import ModelConfig, Transformer, causal_attention_mask, positions_from_mask, token_logprobs
  from grpo_jax.sampling import Sampler, SamplingConfig

  shape = dict(vocab_size=1024, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32,
               max_position_embeddings=512)
  models = {
      "dense (baseline)": ModelConfig(intermediate_size=args.k * args.expert_size, **shape),
      "moe ragged": ModelConfig(intermediate_size=args.k * args.expert_size, num_experts=args.experts,
                                num_experts_per_tok=args.k, moe_intermediate_size=args.expert_size, **shape),
  }
  models["moe ragged"] = models["moe ragged"].replace(moe_impl="ragged")
  models["moe blocks"] = models["moe ragged"].replace(moe_impl="blocks")
  models["moe dense"] = models["moe ragged"].replace(moe_impl="dense")
  B, P, C = args.rows, 32, args.new_tokens
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, 1024, size=P)) for _ in range(B)]
  tokens = jnp.asarray(rng.integers(1, 1024, size=(B, P + C)), jnp.int32)
  mask = jnp.ones((B, P + C), bool)

  def decode_fn(cfg):
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=C, greedy=True, pad_id=0), prompt_bucket_min=P)
    return lambda: jax.block_until_ready(sampler.generate(state, prompts, jax.random.key(0)).completion_BxC)

  def update_fn(cfg):
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

    def loss(state):
      model = nnx.merge(graphdef, state)
      hidden, _ = model(tokens, positions_from_mask(mask), causal_attention_mask(mask))
      logp, _ = token_logprobs(hidden[:, P - 1:-1], model.output_matrix_DxV(), tokens[:, P:])
      return jnp.sum(logp)
    grad = jax.jit(jax.grad(loss))
    return lambda: jax.block_until_ready(grad(state))

  print(f"E={args.experts} experts of F={args.expert_size}, k={args.k}; dense baseline F={args.k * args.expert_size}; "
        f"{B} rows, {P} prompt + {C} new tokens; {jax.devices()[0].platform}, jax {jax.__version__}")
  for what, make in (("decode", decode_fn), ("update", update_fn)):
    runs = {name: make(cfg) for name, cfg in models.items()}
    for run in runs.values():
      run()  # compile
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
      for name, run in runs.items():
        t = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - t)
    base = statistics.median(times["dense (baseline)"])
    for name, ts in times.items():
      med = statistics.median(ts)
      rate = f", {B * C / med:,.0f} tokens/s" if what == "decode" else ""
      print(f"  {what:6s} {name:17s} {med * 1e3:8.1f} ms{rate}  ({med / base:.2f}x the dense baseline)")


if __name__ == "__main__":
  main()
