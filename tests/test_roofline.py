"""benchmarks/roofline.py: its FLOP formulas against XLA's cost analysis of the model's own forward, the GSM8K
0.5B figures, and the --measured table from a hand-made campaign JSON."""
import json
import os

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from benchmarks import roofline as rl
from grpo_jax.model import Transformer
from grpo_jax.model.config import FULL, SLIDING, ModelConfig
from grpo_jax.model.logprobs import positions_from_mask
from grpo_jax.model.transformer import init_cache

# float32 compute: with bfloat16, XLA:CPU converts every dot's operands to float32 and counts each converted
# element as a FLOP (a CPU artifact; a GPU multiplies bfloat16 directly).
QWEN = ModelConfig(vocab_size=1024, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=32, tie_word_embeddings=True, attention_bias=True, family="qwen2")
GEMMA = ModelConfig(vocab_size=1024, hidden_size=128, intermediate_size=384, num_layers=3, num_heads=4,
                    num_kv_heads=1, head_dim=32, tie_word_embeddings=True, qk_norm=True, family="gemma3_text",
                    sliding_window=8, layer_types=(SLIDING, SLIDING, FULL))
# The formulas count the matmuls only; XLA also counts every elementwise op (norms, rotary, the mask's select,
# softmax, SiLU/GELU, residual adds) at one FLOP per element: O(D + F + N S) per token and layer against the
# matmuls' O(D (N H + F) + N H S), 1-2.5% at these shapes (measured 0.978-0.989). So formula / XLA must lie in
# [0.95, 1]: above 1 the formula counts work XLA does not do; below 0.95 it misses a term. Leaving out the
# attention (ratio 0.87-0.93) or the LM head (decode 0.76-0.81), or attending a sliding layer over the whole
# cache (1.02-1.07), each falls outside; `test_the_band_catches_a_missing_or_extra_term` checks that.
BAND = (0.95, 1.0)


def _xla_cost(f, *args) -> dict:
  cost = jax.jit(f).lower(*args).compile().cost_analysis()
  return cost[0] if isinstance(cost, list) else cost


def _counts(cfg, R=2, P=64, C=64, B=8):
  """(XLA prefill FLOPs, XLA decode-step FLOPs, XLA decode-step bytes, parameters) of the model's cached forward
  (the sampler's calls): R prompts of P tokens into a cache of P + C slots with the last position's logits, and
  one token of B rows over a full cache with its logits."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  S = P + C

  def prefill(state, tokens_RxP, mask_RxP):
    model = nnx.merge(graphdef, state)
    hidden, cache = model(tokens_RxP, positions_from_mask(mask_RxP), jnp.ones((R, P, S), bool),
                          init_cache(cfg, R, S), 0)
    return model.logits(hidden[:, -1:]), cache

  def step(state, token_Bx1, cache, slot):
    model = nnx.merge(graphdef, state)
    hidden, cache = model(token_Bx1, jnp.zeros((B, 1), jnp.int32), jnp.ones((B, 1, S), bool), cache, slot)
    return model.logits(hidden), cache

  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
  pre = _xla_cost(prefill, state, i32(R, P), i32(R, P))
  dec = _xla_cost(step, state, i32(B, 1), jax.eval_shape(lambda: init_cache(cfg, B, S)), i32())
  params = sum(x.size for x in jax.tree.leaves(state))
  return pre["flops"], dec["flops"], dec["bytes accessed"], params


@pytest.fixture(scope="module", params=[QWEN, GEMMA], ids=["qwen2", "gemma3"])
def counted(request):
  return request.param, _counts(request.param)


def _formulas(cfg, R=2, P=64, C=64, B=8, keys_cfg=None, attention=True, head=True):
  k = keys_cfg or cfg
  keys = lambda slots, new: rl.attention_keys_L(k, slots, new) if attention else [0] * cfg.num_layers
  return (rl.forward_flops(cfg, R * P, keys(P + C, P), R if head else 0),
          rl.forward_flops(cfg, B, keys(P + C, 1), B if head else 0))


def test_forward_flops_match_xla_cost_analysis(counted):
  cfg, (xla_prefill, xla_step, _, _) = counted
  prefill, step = _formulas(cfg)
  assert BAND[0] <= prefill / xla_prefill <= BAND[1]
  assert BAND[0] <= step / xla_step <= BAND[1]


def test_the_band_catches_a_missing_or_extra_term(counted):
  cfg, (xla_prefill, xla_step, _, _) = counted
  inside = lambda pair: BAND[0] <= pair[0] / xla_prefill <= BAND[1] and BAND[0] <= pair[1] / xla_step <= BAND[1]
  assert not inside(_formulas(cfg, attention=False))
  assert not inside(_formulas(cfg, head=False))
  if cfg.has_sliding:
    assert not inside(_formulas(cfg, keys_cfg=cfg.replace(layer_types=None)))


def test_decode_step_bytes_are_a_floor_of_what_xla_touches(counted):
  """The floor's bytes (float32 weights once, the whole cache once, as the step reads it) never exceed the
  bytes XLA's program accesses (it also counts activations, logits and its in-place cache update)."""
  cfg, (_, _, xla_bytes, params) = counted
  S = 128
  slots = [min(cfg.sliding_window, S) if cfg.is_sliding(i) else S for i in range(cfg.num_layers)]
  floor = params * 4 + rl.kv_cache_bytes(cfg, 8, slots, cfg.dtype)
  assert floor <= xla_bytes


def test_gsm8k_half_b_figures():
  """The issue's sanity figures at the GSM8K recipe's Qwen2.5-0.5B shape: ~2 GB of float32 weights per token
  step plus the KV cache at mid-length (256 rows x 512 slots x 24 layers: 1.61 GB), ~1 ms a step at 3.35 TB/s;
  the update's FLOPs ~5.7e14 (4 passes with remat over 16 x 256 prompt + 256 x 512 completion tokens)."""
  w = rl.Workload()
  cfg = rl.model_config("qwen2.5-0.5b", w)
  n = rl.num_params(cfg)
  assert n == 494_032_768
  assert rl.decode_keys_L(cfg, w) == [256 + 512 / 2] * 24  # mean of P + t over t = 1..C-1
  step = rl.decode_step(cfg, n, w, weights="stored")  # the sampler before it cast the weights once per call
  kv = rl.kv_cache_bytes(cfg, 256, [512 + 1] * 24, "bfloat16")
  assert step.bytes == n * 4 + kv and 1.6e9 < kv < 1.62e9
  assert 1.0e-3 < rl.floor_s(step.flops, step.bytes, *rl.PEAKS["H100 SXM"]) < 1.1e-3
  step = rl.decode_step(cfg, n, w)  # today's: bf16 weights
  assert step.bytes == n * 2 + kv
  ps = rl.phases(cfg, n, w)
  assert ps["decode"].bytes == 511 * step.bytes
  assert 5.5e14 < ps["update"].flops < 5.8e14
  body, head = rl.logprob_forward_flops(cfg, w)
  assert ps["update"].flops == 4 * body + 4 * head
  assert rl.update(cfg, n, w._replace(remat=False)).flops == 3 * body + 4 * head


def _campaign(tmp_path, device="NVIDIA H100 80GB HBM3"):
  result = {"model": "qwen2.5-0.5b", "recipe": "experiments/gsm8k.py", "rows": 256, "prompt_len": 256,
            "new_tokens": 512, "update_prompt_width": 256, "update_completion_width": 512, "micro_batch": 16,
            "beta": 0.04, "remat": True, "dtype": "bfloat16", "param_dtype": "float32",
            "median": {"sample_s": 2.3, "reference_s": 0.7, "update_s": 3.1, "step_s": 6.1},
            "sampler_tokens_per_s": 57000.0, "peak_bytes": 14600000000}
  data = {"device": device, "versions": {"jax": "0.11.2"},
          "parts": {"step_qwen2.5-0.5b": {"status": "ok", "seconds": 140.2, "result": result},
                    "step_gemma3-1b": {"status": "timeout", "seconds": 300.0, "result": None},
                    "sampler": {"status": "ok", "seconds": 10.0, "result": {"tokens_per_s": 1.0}}}}
  path = tmp_path / "campaign.json"
  path.write_text(json.dumps(data))
  return path, data


def test_measured_rows_give_the_fraction_of_the_floor_and_mfu(tmp_path):
  _, data = _campaign(tmp_path)
  rows = rl.measured_rows(data)
  assert [(r["part"], r.get("phase", r["status"])) for r in rows] == [
      ("step_gemma3-1b", "timeout"), ("step_qwen2.5-0.5b", "sample"), ("step_qwen2.5-0.5b", "reference"),
      ("step_qwen2.5-0.5b", "update"), ("step_qwen2.5-0.5b", "step")]
  w = rl.Workload()
  cfg = rl.model_config("qwen2.5-0.5b", w)
  ps = rl.phases(cfg, rl.num_params(cfg), w)
  peak = rl.PEAKS["H100 SXM"]
  by = {r["phase"]: r for r in rows[1:]}
  update_floor = rl.floor_s(ps["update"].flops, ps["update"].bytes, *peak)
  assert by["update"]["floor_s"] == pytest.approx(update_floor)
  assert by["update"]["floor_fraction"] == pytest.approx(update_floor / 3.1)
  assert by["update"]["mfu"] == pytest.approx(ps["update"].flops / (3.1 * peak[0]))
  sample = [ps["prefill"], ps["decode"]]
  assert by["sample"]["floor_s"] == pytest.approx(sum(rl.floor_s(p.flops, p.bytes, *peak) for p in sample))
  assert by["step"]["floor_s"] == pytest.approx(sum(by[k]["floor_s"] for k in ("sample", "reference", "update")))
  assert by["step"]["flops"] == pytest.approx(sum(p.flops for p in ps.values() if p is not ps["decode_step"]))


def test_measured_table_matches_the_device_and_lists_failed_parts(tmp_path, capsys):
  path, _ = _campaign(tmp_path, device="NVIDIA H200")
  assert rl.main(["--measured", str(path)]) == 0
  out = capsys.readouterr().out
  assert "-> peaks H200" in out and "| step_gemma3-1b | timeout |" in out
  assert "| step_qwen2.5-0.5b | update | 3.1 s |" in out
  path, data = _campaign(tmp_path, device="NVIDIA A100-SXM4-80GB")
  rows = rl.measured_rows(data)
  assert all(r["peak"] is None and r.get("floor_s") is None and r.get("mfu") is None for r in rows)
  data["parts"]["step_qwen2.5-0.5b"]["result"]["model"] = "my-model"
  assert rl.measured_rows(data)[1]["status"] == "model 'my-model' is not a preset"
  assert [rl.device_peak(d) for d in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "TPU v5 lite", "cpu")] == [
      "H100 SXM", None, "TPU v5e", None]


def test_decode_keys_of_the_loop_as_written_with_and_without_segments():
  """P = 2, C = 5: steps 1..4 attend to all 7 slots; in segments of 2 (ends 2, 4, 5: widths 4, 6, 7) step 1 to 4
  slots, steps 2-3 to 6 and step 4 to 7; a sliding layer (window 8 > 7) the same, and the filled slots 2 + t."""
  w = rl.Workload(prompt_width=2, new_tokens=5)
  assert rl.decode_keys_L(QWEN, w, filled=False) == [7.0, 7.0]
  assert rl.decode_keys_L(QWEN, w._replace(decode_segment=2), filled=False) == [(4 + 6 + 6 + 7) / 4] * 2
  assert rl.decode_keys_L(GEMMA, w._replace(decode_segment=2), filled=True) == [(3 + 4 + 5 + 6) / 4] * 3
  long = rl.Workload(prompt_width=4, new_tokens=12, decode_segment=4)  # widths 8, 12, 16: the window (8) caps
  sliding, _, full = rl.decode_keys_L(GEMMA, long, filled=False)
  assert (sliding, full) == ((3 * 8 + 4 * 8 + 4 * 8) / 11, (3 * 8 + 4 * 12 + 4 * 16) / 11)


def _plan(micro, remat, floor, fits=True):
  return {"micro_batch": micro, "remat": remat, "floor_s": {"H100 SXM": floor}, "fits": {"H100 SXM": fits}}


def test_the_chosen_update_plan_fits_is_fastest_and_breaks_ties_by_size():
  """Hand-made plans: the fastest that fits; within 1% of it the largest micro-batch, then remat off; none fits:
  None."""
  plans = [_plan(8, False, 1.00), _plan(16, True, 1.005), _plan(16, False, 1.009), _plan(32, False, 0.5, False)]
  assert rl.choose_update_plan(plans, "H100 SXM") is plans[2]
  plans = [_plan(8, False, 1.00), _plan(16, False, 1.02)]  # 2% slower: the smaller micro-batch wins
  assert rl.choose_update_plan(plans, "H100 SXM") is plans[0]
  assert rl.choose_update_plan([_plan(8, True, 1.0, fits=False)], "H100 SXM") is None


def test_update_plans_of_the_gsm8k_recipe_use_memory_fits_estimate_and_the_floor():
  """Each plan's memory is benchmarks/memory_fit.py's estimate of the whole run for the recipe with that
  micro-batch and remat, its FLOPs the update's (3 forwards + 1 with remat, the head 4 times), and it fits where
  the estimate is within the device's share. On an H100 the 0.5B recipe's update leaves remat off: without it
  the 16-row micro-batch's activations are ~34 GiB (16 rows x 24 layers x 256 + 512 positions' float32 scores),
  below the 60 GiB the plan may use."""
  spec = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "gsm8k.py")
  w = rl.recipe_workload(spec)
  cfg = rl.model_config("qwen2.5-0.5b", w)
  n = rl.num_params(cfg)
  plans = rl.update_plans(cfg, n, w)
  assert sorted({p["micro_batch"] for p in plans}) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
  body, head = rl.logprob_forward_flops(cfg, w)
  config = rl.memory_fit.recipe_config(spec)
  for p in plans:
    if p["micro_batch"] not in (16, 32):
      continue
    config.grpo.micro_batch_size, config.model.remat = p["micro_batch"], p["remat"]
    assert p["memory"] == rl.memory_fit.the_estimate(cfg.replace(remat=p["remat"]), config)["run"]
    if p["micro_batch"] == 16:  # the recipe's widths and sharing: the same body FLOPs
      assert p["flops"] == pytest.approx((3 + p["remat"]) * body + 4 * head)
    for d in rl.PEAKS:
      assert p["fits"][d] == (p["memory"] <= rl.HBM_BYTES[d] * 0.95 * 0.8)
  chosen = rl.choose_update_plan(plans, "H100 SXM")
  assert chosen["remat"] is False and chosen["micro_batch"] >= 16
  assert chosen["floor_s"]["H100 SXM"] < 0.85 * rl.floor_s(rl.update(cfg, n, w).flops, 0.0, *rl.PEAKS["H100 SXM"])
