"""Sampler throughput: grpo_jax `Sampler.generate` vs transformers `generate` (torch CPU, KV cache on).

  .venv/bin/python benchmarks/sampler_bench.py                 # batch 32 x 64 new tokens, sampling at T=1
  .venv/bin/python benchmarks/sampler_bench.py --mode greedy
  .venv/bin/python benchmarks/sampler_bench.py --devices 1     # one XLA device (one decode loop)

Both sides load the same tiny random Qwen2 checkpoint (built with transformers + torch and saved as
safetensors in a temporary directory; default 4 layers, hidden 256, 4 heads / 2 kv heads, MLP 1024,
vocab 4096: 6.0M parameters with an untied head), generate exactly --new-tokens tokens per row (no stop ids,
no eos) from the same left-padded prompts, and are timed alternately (JAX, torch, JAX, ...) after one warm-up
call each (JAX's compiles), so both see the same background load. Prints tokens/s for both and the ratio.

Cores: torch runs with --torch-threads intra-op threads (default 2, this machine's cores). JAX runs the
sampler on a mesh of --devices host devices (default: the number of cores), i.e. data parallel, one decode
loop per core over its share of the batch; an XLA CPU device runs each decode loop mostly on one core, and a
second device is how the second core is put to work. `--devices 1` shows the single-device number.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def parse_args():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--prompt-min", type=int, default=8, help="prompt lengths are uniform in [min, max]")
  p.add_argument("--prompt-max", type=int, default=24)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--kv-heads", type=int, default=2)
  p.add_argument("--mlp", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--mode", choices=("sample", "greedy"), default="sample",
                 help="sample: temperature 1, no top-k/top-p; greedy: argmax")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per side; the median is reported")
  p.add_argument("--torch-threads", type=int, default=2)
  p.add_argument("--devices", type=int, default=os.cpu_count(),
                 help="XLA host devices the JAX sampler splits the batch over (default: the number of cores)")
  return p.parse_args()


def seconds(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def interleaved_times(fn_a, fn_b, repeats: int):
  """Per-call seconds of a and b, alternating a, b, a, b, ... after one warm-up each, so that both sides
  see the same background load on a shared machine."""
  fn_a()
  fn_b()
  pairs = [(seconds(fn_a), seconds(fn_b)) for _ in range(repeats)]
  return [a for a, _ in pairs], [b for _, b in pairs]


def main():
  args = parse_args()
  # Host devices are fixed when JAX starts its CPU backend: set them before importing JAX.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={args.devices}")
  import jax
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from grpo_jax.model import sharding
  from grpo_jax.model.hf_io import from_pretrained
  from grpo_jax.sampling import Sampler, SamplingConfig

  torch.set_num_threads(args.torch_threads)
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen2Config(
      vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp, num_hidden_layers=args.layers,
      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, max_position_embeddings=1024,
      tie_word_embeddings=False)
  hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
  n_params = sum(p.numel() for p in hf.parameters())

  rng = np.random.default_rng(0)
  lengths = rng.integers(args.prompt_min, args.prompt_max + 1, args.batch)
  prompts = [rng.integers(1, args.vocab, n).tolist() for n in lengths]
  B, C = args.batch, args.new_tokens

  with tempfile.TemporaryDirectory() as ckpt:
    hf.save_pretrained(ckpt)
    model = from_pretrained(ckpt)
  graphdef, state = nnx.split(model)
  mesh = sharding.make_mesh(devices=jax.devices()[:args.devices])
  state = sharding.shard_state(state, mesh)  # replicated on a 'data' mesh: the sampler splits the batch
  greedy = args.mode == "greedy"
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=C, temperature=1.0, greedy=greedy, pad_id=0))
  keys = iter(jax.random.split(jax.random.key(0), args.repeats + 1))

  def run_jax():
    res = sampler.generate(state, prompts, next(keys))
    assert res.completion_mask_BxC.sum() == B * C, "the JAX sampler stopped early"

  P = int(lengths.max())
  ids = torch.zeros(B, P, dtype=torch.long)
  attn = torch.zeros(B, P, dtype=torch.long)
  for i, p in enumerate(prompts):
    ids[i, P - len(p):] = torch.tensor(p)
    attn[i, P - len(p):] = 1
  gen_kw = dict(max_new_tokens=C, min_new_tokens=C, do_sample=not greedy, use_cache=True, pad_token_id=0,
                eos_token_id=None)
  if not greedy:
    gen_kw.update(temperature=1.0, top_k=0, top_p=1.0)

  def run_torch():
    with torch.inference_mode():
      out = hf.generate(ids, attention_mask=attn, **gen_kw)
    assert out.shape == (B, P + C), out.shape

  times_jax, times_torch = interleaved_times(run_jax, run_torch, args.repeats)
  t_jax, t_torch = statistics.median(times_jax), statistics.median(times_torch)
  tps_jax, tps_torch = B * C / t_jax, B * C / t_torch
  pair_ratios = sorted(t / j for j, t in zip(times_jax, times_torch))
  print(f"model: Qwen2 {args.layers} layers, hidden {args.hidden}, heads {args.heads}/{args.kv_heads}, "
        f"mlp {args.mlp}, vocab {args.vocab} ({n_params / 1e6:.1f}M params, float32)")
  print(f"batch {B} x {C} new tokens, prompts {args.prompt_min}-{args.prompt_max} tokens, mode {args.mode}, "
        f"median of {args.repeats}; jax {jax.__version__} on {args.devices} {jax.devices()[0].platform} "
        f"device(s), "
        f"torch {torch.__version__} with {args.torch_threads} threads; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  print(f"grpo_jax Sampler:         {tps_jax:9.0f} tokens/s ({t_jax * 1e3:.1f} ms per call)")
  print(f"transformers generate:    {tps_torch:9.0f} tokens/s ({t_torch * 1e3:.1f} ms per call)")
  print(f"ratio (grpo_jax / transformers): {tps_jax / tps_torch:.2f}x "
        f"(per interleaved pair: min {pair_ratios[0]:.2f}x, max {pair_ratios[-1]:.2f}x)")


if __name__ == "__main__":
  main()
