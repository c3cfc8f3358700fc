"""benchmarks/gpu_campaign.py's reading of a device profile (only a GPU writes one with kernels, so a hand-made
Chrome trace stands in) and its table."""
import json
import os

from benchmarks import gpu_campaign as gc


def trace(kernels_per_step: int, steps: int) -> list[dict]:
  """A Perfetto/Chrome trace as jax.profiler writes it: a host process, a GPU process with a compute stream and
  XLA's derived "XLA Ops" line (which repeats the kernels and must not be counted twice)."""
  events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 2, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
            {"ph": "M", "pid": 2, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
            {"ph": "X", "pid": 1, "tid": 3, "name": "PjitFunction(_decode_fn)", "dur": 5_000_000}]
  for s in range(steps):
    for k in range(kernels_per_step):
      name = "gemm_bf16" if k % 2 else "loop_fusion"
      for tid in (7, 9):
        events.append({"ph": "X", "pid": 2, "tid": tid, "name": name, "dur": 100 if k % 2 else 10})
  return events


def test_kernels_per_decode_step_count_the_streams_only():
  summary = gc.kernel_summary(trace(kernels_per_step=6, steps=4), decode_steps=4, wall_s=0.01)
  assert summary["kernels"] == 24 and summary["kernels_per_decode_step"] == 6
  assert summary["matmul_kernels_per_decode_step"] == 3  # the gemm_bf16 ones, not the loop fusions
  assert abs(summary["matmul_fraction"] - 100 / 110) < 1e-9  # 100 us of each 110 us pair
  assert summary["device_thread_events"] == {"Stream #7(Compute)": 24, "XLA Ops": 24}
  assert abs(summary["kernel_s"] - 12 * 110e-6) < 1e-12
  assert abs(summary["gpu_busy_fraction"] - 12 * 110e-6 / 0.01) < 1e-9
  assert [k["name"] for k in summary["top_kernels"]] == ["gemm_bf16", "loop_fusion"]
  assert summary["top_kernels"][0]["count"] == 12


def test_a_cpu_trace_has_no_kernels_and_the_table_says_what_ran():
  assert gc.kernel_summary(trace(3, 2)[:1] + trace(3, 2)[4:5], decode_steps=2, wall_s=1.0)["kernels"] == 0
  campaign = {"date": "2026-11-26", "device": "NVIDIA H200", "versions": {"jax": "0.11.2", "trl": None},
              "parts": {"step_qwen2.5-0.5b": {"status": "ok", "seconds": 99.0, "result": {
                  "median": {"step_s": 2.5, "sample_s": 1.0, "reference_s": 0.3, "update_s": 1.2},
                  "peak_bytes": 2 * 1024 ** 3, "sampler_tokens_per_s": 150_000.0}},
                        "tests": {"status": "skipped", "seconds": 0}}}
  table = gc.table(campaign)
  assert "versions: jax 0.11.2\n" in table  # a missing package is left out
  assert "| step_qwen2.5-0.5b | ok | 99.0 | step 2.50 s (sample 1.00, reference 0.30, update 1.20); sampler " \
         "150,000 tokens/s; peak 2.00 GiB |" in table
  assert "| tests | skipped | 0 |  |" in table


def test_the_update_plan_part_runs_the_step_with_roofline_choice(tmp_path, monkeypatch):
  """--plan sets the recipe's micro-batch and remat to roofline.py's choice for the device, and says so."""
  from benchmarks import roofline as rl
  monkeypatch.syspath_prepend(os.path.dirname(gc.__file__))  # the children import their neighbours as scripts do
  cfg, config = gc.recipe_at("qwen2.5-0.5b", smoke=True)
  w = rl.config_workload(config)
  want = rl.choose_update_plan(rl.update_plans(cfg, rl.num_params(cfg), w), "H200")
  result = gc.Result(str(tmp_path / "part.json"))
  cfg, config = gc.with_update_plan(cfg, config, "NVIDIA H200", result)
  assert (config.grpo.micro_batch_size, config.model.remat, cfg.remat) == (want["micro_batch"], want["remat"],
                                                                            want["remat"])
  assert (w.micro_batch, w.remat) == (4, True) and (want["micro_batch"], want["remat"]) != (4, True)
  assert result["update_plan"]["device"] == "H200" and (tmp_path / "part.json").exists()


def test_sampler_parts_run_after_the_step_part_timed_out_and_the_others_are_skipped(tmp_path, monkeypatch):
  """The step part's timeout (e.g. a slow update compile) skips the parts that compile an update, not those that
  time the sampler alone; its failure skips both."""
  ran = []

  def fake_run(part, seconds, out, scratch, smoke, log):
    ran.append(part["name"])
    return {"status": step_status if part["name"] == "step_qwen2.5-0.5b" else "ok", "seconds": 1.0}

  monkeypatch.setattr(gc, "run_part", fake_run)
  monkeypatch.setattr(gc, "versions", lambda: {})
  only = ("step_qwen2.5-0.5b,compile_cached,decode_host_test_every_step,decode_segments,decode_pallas,"
          "step_update_plan,decode_flags")
  for step_status, want in (("timeout", ["decode_host_test_every_step", "decode_flags", "decode_pallas",
                                         "decode_segments"]),
                            ("failed (exit 1)", [])):
    ran.clear()
    gc.main(["--smoke", "--only", only, "--out", str(tmp_path / step_status[:4]),
             "--scratch", str(tmp_path / "scratch")])
    assert ran == ["step_qwen2.5-0.5b", *want]
    parts = json.loads((tmp_path / step_status[:4] / "campaign.json").read_text())["parts"]
    assert parts["compile_cached"]["status"] == parts["step_update_plan"]["status"] == "skipped"
    assert parts["step_update_plan"]["reason"] == f"needs step_qwen2.5-0.5b, which ended {step_status}"


def test_head_backward_bench_times_both_products_on_the_same_gradient():
  """benchmarks/head_backward_bench.py: both variants' gradients agree within bf16 rounding, each is timed."""
  from benchmarks import head_backward_bench as hb
  r = hb.measure(rows=2, positions=16, hidden=32, vocab=256, chunk=8, repeats=1)
  assert r["max_rel_diff"] < 0.02 and r["float32_backward_s"] > 0 and r["bf16_backward_s"] > 0
  assert r["ratio"] == r["float32_backward_s"] / r["bf16_backward_s"]
