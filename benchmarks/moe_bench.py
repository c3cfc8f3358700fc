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


def measure(*, experts: int, k: int, expert_size: int, rows: int, new_tokens: int, repeats: int = 3,
            hidden: int = 256, layers: int = 4, heads: int = 8, vocab: int = 1024, dtype: str = "float32",
            impls: tuple[str, ...] = ("ragged", "blocks", "dense")) -> dict:
  """{"decode"|"update": {model: {"seconds": median, "ratio": to the dense baseline[, "tokens_per_s"]}}}."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from grpo_jax.model import ModelConfig, Transformer, causal_attention_mask, positions_from_mask, token_logprobs
  from grpo_jax.sampling import Sampler, SamplingConfig

  shape = dict(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads // 2,
               head_dim=hidden // heads, max_position_embeddings=4096, param_dtype=dtype, dtype=dtype,
               intermediate_size=k * expert_size)
  moe = ModelConfig(num_experts=experts, num_experts_per_tok=k, moe_intermediate_size=expert_size, **shape)
  models = {"dense (baseline)": ModelConfig(**shape), **{f"moe {impl}": moe.replace(moe_impl=impl) for impl in impls}}
  B, P, C = rows, 32, new_tokens
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, vocab, size=P)) for _ in range(B)]
  tokens = jnp.asarray(rng.integers(1, vocab, size=(B, P + C)), jnp.int32)
  mask = jnp.ones((B, P + C), bool)

  def decode_fn(cfg):
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=C, greedy=True, pad_id=0), prompt_bucket_min=P)
    return lambda: jax.block_until_ready(sampler.generate(state, prompts, jax.random.key(0)).completion_BxC)

  def update_fn(cfg):
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

    def loss(state):
      model = nnx.merge(graphdef, state)
      hidden_BxTxD, _ = model(tokens, positions_from_mask(mask), causal_attention_mask(mask))
      logp, _ = token_logprobs(hidden_BxTxD[:, P - 1:-1], model.output_matrix_DxV(), tokens[:, P:])
      return jnp.sum(logp)
    grad = jax.jit(jax.grad(loss))
    return lambda: jax.block_until_ready(grad(state))

  out = {}
  for what, make in (("decode", decode_fn), ("update", update_fn)):
    runs = {name: make(cfg) for name, cfg in models.items()}
    for run in runs.values():
      run()  # compile
    times = {name: [] for name in runs}
    for _ in range(repeats):
      for name, run in runs.items():
        t = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - t)
    base = statistics.median(times["dense (baseline)"])
    out[what] = {name: {"seconds": statistics.median(ts), "ratio": statistics.median(ts) / base,
                        **({"tokens_per_s": B * C / statistics.median(ts)} if what == "decode" else {})}
                 for name, ts in times.items()}
  return out


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
  result = measure(experts=args.experts, k=args.k, expert_size=args.expert_size, rows=args.rows,
                   new_tokens=args.new_tokens, repeats=args.repeats)
  print(f"E={args.experts} experts of F={args.expert_size}, k={args.k}; dense baseline F={args.k * args.expert_size}; "
        f"{args.rows} rows, 32 prompt + {args.new_tokens} new tokens; {jax.devices()[0].platform}, jax {jax.__version__}")
  for what, rows in result.items():
    for name, r in rows.items():
      rate = f", {r['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in r else ""
      print(f"  {what:6s} {name:17s} {r['seconds'] * 1e3:8.1f} ms{rate}  ({r['ratio']:.2f}x the dense baseline)")


if __name__ == "__main__":
  main()
