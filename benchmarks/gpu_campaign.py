#!/usr/bin/env python
"""The accelerator campaign (issue 45): what one short GPU call measures, prepared and checked on a CPU.

  bash benchmarks/gpu_campaign.sh                                  # on the GPU machine (see that file)
  python benchmarks/gpu_campaign.py --smoke --out /tmp/campaign    # every part at tiny shapes on a CPU: a check

A GPU is lent now and then, for minutes, so everything it should tell us runs in one call of at most
`--budget` seconds (default 550: with the wheels' install, one device call of 595 s). The parts run in order of
value, each in its own process with its own time budget; a part is skipped when less than its minimum is left,
and a part that outlives its budget is killed with what it had written kept. After every part the campaign
rewrites `campaign.json` (every part's status, seconds and result, the device and the versions) and
`campaign.md` (one table), so a call cut short still
returns what finished.

Parts (shapes of experiments/gsm8k.py: 16 prompts x G 16 = 256 rows, prompts padded to 256, 512 new tokens, bf16
compute over float32 parameters, remat, beta 0.04 with the reference, micro-batches of 16; random weights of
the named shape, which never stop early, so every row decodes all 512 tokens: the worst case):
  step_qwen2.5-0.5b  steps with a fresh compilation cache: each phase's seconds and peak device memory, the
                     XLA memory analysis of the update, compile seconds and launch to the first step (cold);
                     then the sampler alone (tokens/s at 256 x 512) and a profile of one sampler call: kernels
                     launched per decode step (and matmuls among them), the GPU's busy fraction, the kernels that take
                     the time; then one more step with its update profiled: its kernels, the share of the GPU's
                     time in matmuls, the kernels that take the rest (attention scores, log-prob chunks, AdamW)
  compile_cached     a second process on the same cache: launch to the first step and compile seconds (warm)
  decode_host_test_every_step  the sampler alone with a host test of the loop after every token step (the
                     decode loop before 2026-11-27): the baseline of the static inner trip count
  decode_flags       the sampler alone under other XLA flags (command buffers): tokens/s against the first part's
  head_backward      the LM head's backward at one micro-batch (benchmarks/head_backward_bench.py): autodiff's
                     float32 matmuls against grpo_jax's bf16 ones, their ratio and the gradients' difference
  step_update_plan   the same steps with the update's micro-batch size and remat that `roofline.py --plan` picks
                     for this device (the fastest floor whose memory estimate fits; on an H100 at 0.5B: 32 rows,
                     remat off), against the recipe's 16 rows with remat
  decode_pallas      the sampler alone with model.decode_attention="pallas" (grpo_jax/model/decode_attention.py:
                     one Triton kernel per layer and token step, over the filled slots only): tokens/s, and the
                     kernel's outputs against XLA's einsum path at the recipe's shapes (max abs difference)
  tests              the GPU test subset (model, algo, sampling, the update, precision)
  step_cudnn_attention  the same steps with cuDNN's flash attention in the update and reference
  decode_segments    the sampler alone with sampling.decode_segment=128 (each 128-step segment of the decode
                     attends to the cache slots filled by its end): tokens/s against the first part's sampler
  trl_qwen2.5-0.5b   TRL's GRPOTrainer (benchmarks/step_bench.py's TRL side) at the same settings, same shape
  step_gemma3-1b     Gemma 3 1B's shape, same recipe, same measurements as the first part minus the profile
  moe_vs_dense       a Qwen3-30B-A3B-shaped stack (128 experts of 768, 8 per token; 8 layers) against a dense model
                     of its active size: decode tokens/s and update seconds, experts through ragged_dot and blocks
  continuous_batching  static against continuous decoding (sampling.slots) on a long tail of completion lengths
                     (benchmarks/continuous_batching_bench.py: 256 rows, 128 slots, up to 1024 tokens): tokens/s of
                     both, utilization; what a token step costs at 256 and at 128 rows decides benchmarks/
                     async_sim.py's --decode (fixed + per-row) and so whether continuous batching alone pays here

benchmarks/roofline.py --measured campaign.json puts the step parts against the floor of the device.
"""
import argparse
import datetime
import faulthandler
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # as scripts/train.py sets it

RECIPE = "experiments/gsm8k.py"
# XLA's command buffers (CUDA graphs) also around while loops and conditionals: the decode loop's body could then
# launch as one graph per token step instead of one kernel at a time.
COMMAND_BUFFER_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
                        "WHILE,CONDITIONAL")
TESTS = ["tests/model", "tests/algo", "tests/sampling", "tests/train/test_step.py", "tests/test_precision.py"]


# A sampler-only part runs after the step part timed out (it compiles no update, where the time may have gone);
# a part that compiles an update or reads the step's cache needs the step part to have ended "ok".
SAMPLER_ONLY = ("ok", "timeout")


def parts(smoke: bool) -> list[dict]:
  """The campaign's parts in order of value: name, the child's arguments, budget and minimum seconds, and the
  part it needs with the statuses of that part it accepts (`needs_ok`, default "ok")."""
  tests = ["tests/algo/test_advantages.py"] if smoke else TESTS
  return [
      dict(name="step_qwen2.5-0.5b", argv=["step", "--model", "qwen2.5-0.5b", "--steps", "3", "--profile"],
           budget=240, minimum=120),
      dict(name="compile_cached", argv=["step", "--model", "qwen2.5-0.5b", "--steps", "1"], budget=50, minimum=30,
           needs="step_qwen2.5-0.5b"),
      # Sampling took 2.3 s on an H100 (2026-11-23): up to 4.5 ms a token step against a floor of 0.78-1.07 ms.
      # The likeliest gap is the host: a loop of unknown trip count waits for the GPU after every token step, and
      # then enqueues the next step's kernels while the GPU idles. The decode's inner loops now have a static trip
      # count (a host test every 8 steps); this part is the baseline with a test after every step.
      dict(name="decode_host_test_every_step", argv=["sampler", "--model", "qwen2.5-0.5b", "--stop-check-every",
                                                     "1"], budget=60, minimum=40, needs="step_qwen2.5-0.5b",
           needs_ok=SAMPLER_ONLY),
      # Command buffers (CUDA graphs) around the loop: one launch per token step instead of one per kernel.
      dict(name="decode_flags", argv=["sampler", "--model", "qwen2.5-0.5b"], budget=60, minimum=40,
           needs="step_qwen2.5-0.5b", needs_ok=SAMPLER_ONLY,
           env={"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + COMMAND_BUFFER_FLAGS).strip()}),
      # The LM head's backward in bf16 against autodiff's float32 matmuls, one micro-batch (head_backward_bench.py).
      dict(name="head_backward", argv=["head", "--model", "qwen2.5-0.5b"], budget=40, minimum=20),
      # The update with the micro-batch size and remat that roofline.py's plan picks for this device (--plan).
      dict(name="step_update_plan", argv=["step", "--model", "qwen2.5-0.5b", "--steps", "2", "--plan"], budget=120,
           minimum=70, needs="step_qwen2.5-0.5b"),
      dict(name="decode_pallas", argv=["sampler", "--model", "qwen2.5-0.5b", "--decode-attention", "pallas"],
           budget=60, minimum=40, needs="step_qwen2.5-0.5b", needs_ok=SAMPLER_ONLY),
      dict(name="tests", argv=["tests", *tests], budget=90, minimum=40),
      # The update with cuDNN's flash attention (model.attention="cudnn"; XLA's "jax" path in --smoke on a CPU).
      dict(name="step_cudnn_attention", argv=["step", "--model", "qwen2.5-0.5b", "--steps", "2", "--attention",
                                              "jax" if smoke else "cudnn"], budget=120, minimum=70,
           needs="step_qwen2.5-0.5b"),
      dict(name="decode_segments", argv=["sampler", "--model", "qwen2.5-0.5b", "--decode-segment",
                                         "4" if smoke else "128"], budget=60, minimum=40, needs="step_qwen2.5-0.5b",
           needs_ok=SAMPLER_ONLY),
      dict(name="trl_qwen2.5-0.5b", argv=["trl", "--model", "qwen2.5-0.5b", "--steps", "3"], budget=110,
           minimum=60),
      dict(name="step_gemma3-1b", argv=["step", "--model", "gemma3-1b", "--steps", "2"], budget=120, minimum=80),
      # A Qwen3-30B-A3B-shaped layer stack (128 experts of 768, 8 per token) against a dense model of its active
      # size: decode tokens/s and the update through ragged_dot and through blocks (benchmarks/moe_bench.py).
      dict(name="moe_vs_dense", argv=["moe"], budget=120, minimum=60),
      dict(name="continuous_batching", argv=["continuous"], budget=60, minimum=40),
  ]


# ---------------------------------------------------------------------------------------------------------------
# The parent: runs the parts, keeps the JSON and the table.

def versions() -> dict:
  from importlib import metadata
  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "torch", "transformers", "trl"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def device_name() -> str:
  """The GPU's name from nvidia-smi (no JAX in the parent: it would hold the device), else the CPU."""
  try:
    names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20).stdout.strip()
    if names:
      return names.splitlines()[0]
  except (OSError, subprocess.SubprocessError):
    pass
  return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run_part(part: dict, seconds: float, out: str, scratch: str, smoke: bool, log) -> dict:
  """One part in a child process, killed after `seconds`; its status, seconds and whatever result it wrote."""
  result_path = os.path.join(scratch, f"{part['name']}.json")
  if os.path.exists(result_path):
    os.remove(result_path)
  cmd = [sys.executable, "-u", os.path.abspath(__file__), "--child", "--result", result_path, "--out", out,
         "--scratch", scratch, "--deadline", str(round(seconds)),
         *(["--smoke"] if smoke else []), *part["argv"]]
  env = dict(os.environ, **part.get("env", {}))
  t0 = time.time()
  with open(os.path.join(out, "campaign.log"), "a") as logfile:
    logfile.write(f"\n===== {part['name']}: {' '.join(part['argv'])} (budget {seconds:.0f} s)\n")
    logfile.flush()
    child = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                             start_new_session=True)
    try:
      rc = child.wait(timeout=seconds)
      status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
      os.killpg(child.pid, 9)
      child.wait()
      status = "timeout"
  entry = {"status": status, "seconds": round(time.time() - t0, 1), "budget_s": round(seconds)}
  if os.path.exists(result_path):
    with open(result_path) as f:
      entry["result"] = json.load(f)
  if status != "ok":
    entry["log_tail"] = tail(os.path.join(out, "campaign.log"), 15)
  log(f"[campaign] {part['name']}: {status} in {entry['seconds']} s")
  return entry


def tail(path: str, lines: int) -> str:
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:])


def table(campaign: dict) -> str:
  """campaign.md: one row per part, its headline figures."""
  lines = [f"# GPU campaign {campaign['date']}: {campaign['device']}", "",
           "versions: " + ", ".join(f"{k} {v}" for k, v in campaign["versions"].items() if v), "",
           "| part | status | seconds | figures |", "|---|---|---|---|"]
  for name, entry in campaign["parts"].items():
    lines.append(f"| {name} | {entry['status']} | {entry.get('seconds', '')} | {headline(entry.get('result', {}))} |")
  return "\n".join(lines) + "\n"


def headline(r: dict) -> str:
  """The few figures of a part's result that matter, as text."""
  bits = []
  if "median" in r:
    m = r["median"]
    bits.append("step {step_s:.2f} s (sample {sample_s:.2f}, reference {reference_s:.2f}, update {update_s:.2f})"
                .format(**m))
  for key, fmt in (("sampler_tokens_per_s", "sampler {:,.0f} tokens/s"), ("decode_segment", "decode_segment {}"), ("stop_check_every", "a host test every {} token steps"),
                   ("peak_bytes", "peak {:.2f} GiB"),
                   ("launch_to_first_step_s", "launch to first step {:.1f} s"), ("compile_s", "compile {:.1f} s"),
                   ("cache_loads", "{} programs from the cache"), ("kernels_per_decode_step", "{:.0f} kernels/token"),
                   ("matmul_kernels_per_decode_step", "{:.0f} of them matmuls"),
                   ("gpu_busy_fraction", "GPU busy {:.0%} of the sampler call"),
                   ("median_step_s", "TRL step {:.2f} s"), ("summary", "{}")):
    if r.get(key) is not None:
      value = r[key] / 1024 ** 3 if key == "peak_bytes" else r[key]
      bits.append(fmt.format(value))
  if isinstance(r.get("update_profile"), dict) and r["update_profile"].get("kernels"):
    u = r["update_profile"]
    bits.append(f"update: {u['kernels']} kernels, matmuls {u['matmul_fraction'] or 0:.0%} of the GPU's time, "
                f"GPU busy {u['gpu_busy_fraction'] or 0:.0%}")
  if r.get("bf16_backward_s") is not None:
    bits.append("LM-head backward {:.1f} ms in float32 matmuls, {:.1f} ms in bf16 ({:.2f}x)".format(
        r["float32_backward_s"] * 1e3, r["bf16_backward_s"] * 1e3, r["ratio"]))
  if r.get("update_plan"):
    bits.append("update plan: micro-batch {micro_batch}, remat {remat} (estimate {estimate_gib} GiB)"
                .format(**r["update_plan"]))
  if isinstance(r.get("continuous"), dict):
    bits.append("continuous {:,.0f} tokens/s vs static {:,.0f} ({:.2f}x; utilization {:.0%} vs {:.0%})".format(
        r["continuous"]["tokens_per_s"], r["static"]["tokens_per_s"], r["ratio"], r["continuous"]["utilization"],
        r["static"]["utilization"]))
  if r.get("pallas_vs_einsum"):
    bits.append("one layer's decode attention {pallas_us} us (Pallas) vs {einsum_us} us (einsum), max |diff| "
                "{max_abs_diff:.3g}".format(**r["pallas_vs_einsum"]))
  return "; ".join(bits)


def main_parent(args) -> int:
  os.makedirs(args.out, exist_ok=True)
  shutil.rmtree(args.scratch, ignore_errors=True)  # the first part compiles cold
  os.makedirs(args.scratch)
  start = time.time()
  campaign = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device_name(), "versions": versions(), "budget_s": args.budget, "smoke": args.smoke,
              "parts": {}}
  only = set(args.only.split(",")) if args.only else None
  for part in parts(args.smoke):
    if only and part["name"] not in only:
      continue
    left = args.budget - (time.time() - start)
    needed = campaign["parts"].get(part.get("needs"), {"status": "ok"})
    if needed["status"] not in part.get("needs_ok", ("ok",)):
      campaign["parts"][part["name"]] = {"status": "skipped", "seconds": 0,
                                         "reason": f"needs {part['needs']}, which ended {needed['status']}"}
    elif left < part["minimum"]:
      campaign["parts"][part["name"]] = {"status": "skipped", "seconds": 0,
                                         "reason": f"{left:.0f} s left < its minimum {part['minimum']} s"}
    else:
      campaign["parts"][part["name"]] = run_part(part, min(part["budget"], left), args.out, args.scratch,
                                                 args.smoke, print)
    campaign["elapsed_s"] = round(time.time() - start, 1)
    with open(os.path.join(args.out, "campaign.json"), "w") as f:
      json.dump(campaign, f, indent=1)
    with open(os.path.join(args.out, "campaign.md"), "w") as f:
      f.write(table(campaign))
  with open(os.path.join(args.out, "campaign.md"), "a") as f:
    f.write("\n" + against_the_floor(campaign))
  print(table(campaign) + "\n" + against_the_floor(campaign))
  return 0


def against_the_floor(campaign: dict) -> str:
  """roofline.py's table of the step parts: each phase's floor on this device, floor / measured, MFU."""
  try:
    import roofline
    return roofline.measured_table(roofline.measured_rows(campaign)) + "\n"
  except Exception as e:  # the campaign's figures must come back even if this fails
    return f"(roofline.py could not read the campaign: {type(e).__name__}: {e})\n"


# ---------------------------------------------------------------------------------------------------------------
# The children: each writes its result as it goes (`Result.update`), so a part killed at its budget keeps it.

T0 = time.time()


def progress(message: str) -> None:
  """A timestamped line in campaign.log: where a part's time went, even when it is killed."""
  print(f"[{time.time() - T0:7.1f} s] {message}", flush=True)


class Result(dict):
  def __init__(self, path: str):
    super().__init__()
    self.path = path

  def update(self, *a, **kw):
    super().update(*a, **kw)
    with open(self.path + ".tmp", "w") as f:
      json.dump(self, f, indent=1, default=float)
    os.replace(self.path + ".tmp", self.path)


def recipe_at(model: str, smoke: bool, **model_settings):
  """(ModelConfig of the named shape, the recipe's config with benchmark settings and `model_settings` in
  config.model) — tiny shapes with --smoke."""
  import memory_fit
  config = memory_fit.recipe_config(RECIPE)
  config.model.update(model_settings)
  config.optim.warmup_steps = 0  # as TRL's mapping needs; no effect on a step's time
  if smoke:
    config.grpo.prompts_per_step, config.grpo.group_size, config.grpo.micro_batch_size = 2, 4, 4
    config.sampling.max_new_tokens = 16
  cfg = memory_fit.model_config(model, config)
  if smoke:
    cut = {"layer_types": cfg.layer_types[:2]} if cfg.layer_types else {}
    cfg = cfg.replace(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16,
                      vocab_size=1024, **cut)
  return cfg, config


class CompileClock:
  """Seconds XLA spent compiling and programs loaded from the persistent cache (jax.monitoring events)."""

  def __init__(self):
    from jax import monitoring
    self.compile_s, self.compiles, self.cache_loads = 0.0, 0, 0
    monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      self.compile_s += duration
      self.compiles += 1
    elif event == "/jax/compilation_cache/cache_retrieval_time_sec":
      self.cache_loads += 1


def enable_cache(scratch: str) -> str:
  import jax
  path = os.path.join(scratch, "compile_cache")
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def median(values):
  values = sorted(values)
  n = len(values)
  return None if not n else (values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2]))


def sampler_prompts(rig, step_record: dict) -> list[list[int]]:
  """The step's prompts as token lists of its mean prompt length (ids inside the tokenizer's vocabulary)."""
  import numpy as np
  g = rig.config.grpo
  length = max(1, step_record["prompt_tokens"] // (g.prompts_per_step * g.group_size))
  rng = np.random.default_rng(0)
  return [list(rng.integers(10, 200, size=length)) for _ in range(g.prompts_per_step)]


def time_sampler(rig, prompts, calls: int) -> dict:
  """tokens/s of `calls` sampler calls after a first (compiling) one: rows x decode steps per second."""
  import jax
  G = rig.config.grpo.group_size
  rig.sampler.generate(rig.params, prompts, jax.random.key(0), repeats=G)
  seconds = []
  for i in range(calls):
    t0 = time.time()
    rig.sampler.generate(rig.params, prompts, jax.random.key(i + 1), repeats=G)
    seconds.append(time.time() - t0)
  steps = rig.sampler.sampler.last_num_steps
  s = median(seconds)
  return {"sampler_s": s, "sampler_calls_s": seconds, "decode_steps": steps,
          "sampler_tokens_per_s": len(prompts) * G * steps / s}


def profile_sampler(rig, prompts, out: str, scratch: str) -> dict:
  """One sampler call under jax.profiler: the device's kernels, per decode step, and where their time goes."""
  import jax
  trace_dir = os.path.join(scratch, "profile")
  G = rig.config.grpo.group_size
  t0 = time.time()
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    rig.sampler.generate(rig.params, prompts, jax.random.key(7), repeats=G)
  wall = time.time() - t0
  found = read_trace(trace_dir, os.path.join(out, "decode_profile.json.gz"))
  if found is None:
    return {"profile": "no perfetto trace written"}
  events, size = found
  return dict(kernel_summary(events, rig.sampler.sampler.last_num_steps, wall), profile_bytes=size)


def profile_update(rig, step: int, out: str, scratch: str) -> dict:
  """One more step with its update under jax.profiler: the update's kernels, the share of the GPU's time in
  matmuls, and the kernels that take the time (what the rest is: attention scores, log-prob chunks, AdamW)."""
  trace_dir = os.path.join(scratch, "update_profile")
  record = rig.run_step(step, data_step=1, trace_update=trace_dir)
  found = read_trace(trace_dir, os.path.join(out, "update_profile.json.gz"))
  if found is None:
    return {"update_profile": "no perfetto trace written"}
  events, size = found
  summary = kernel_summary(events, 1, record["update_s"])
  summary.pop("kernels_per_decode_step"), summary.pop("matmul_kernels_per_decode_step")
  return {"update_profile": dict(summary, profile_bytes=size)}  # profiled_call_s: the update's seconds


def read_trace(trace_dir: str, keep_as: str):
  """(trace events, file bytes) of the newest Perfetto trace under `trace_dir`, or None; a copy goes to `keep_as`
  when it is small enough to come back with the results."""
  import glob
  import gzip
  found = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True))
  if not found:
    return None
  with gzip.open(found[-1], "rt") as f:
    events = json.load(f)
  size = os.path.getsize(found[-1])
  if size < 15 * 1024 ** 2:
    shutil.copy(found[-1], keep_as)
  return (events["traceEvents"] if isinstance(events, dict) else events), size


# cuBLAS / cuBLASLt (sm90_xmma_gemm_..., cutlass_...), XLA's Triton GEMM fusions (triton_gemm_..., gemm_fusion_...).
MATMUL_KERNEL = re.compile(r"gemm|cutlass|xmma|cublas|matmul", re.IGNORECASE)


def kernel_summary(events: list[dict], decode_steps: int, wall_s: float) -> dict:
  """From a Chrome/Perfetto trace: the device stream threads' events (kernels and copies), their count per decode
  step and that of the matmul kernels (MATMUL_KERNEL), their summed time against the call's wall time, and the 15
  names with the most time."""
  pids, tids = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      pids[e["pid"]] = e["args"]["name"]
    elif e.get("ph") == "M" and e.get("name") == "thread_name":
      tids[e["pid"], e["tid"]] = e["args"]["name"]
  device = {p for p, n in pids.items() if "GPU" in n or "TPU" in n}
  on_stream = [e for e in events if e.get("ph") == "X" and e.get("pid") in device
               and "stream" in tids.get((e["pid"], e.get("tid")), "").lower()]
  by_name: dict[str, list] = {}
  for e in on_stream:
    entry = by_name.setdefault(e["name"][:120], [0, 0.0])
    entry[0] += 1
    entry[1] += e.get("dur", 0) / 1e6
  busy = sum(t for _, t in by_name.values())
  top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:15]
  matmuls = sum(c for n, (c, _) in by_name.items() if MATMUL_KERNEL.search(n))
  matmul_s = sum(t for n, (_, t) in by_name.items() if MATMUL_KERNEL.search(n))
  threads: dict[str, int] = {}  # every device thread's event count, should its lines be named otherwise
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in device:
      name = tids.get((e["pid"], e.get("tid")), "?")
      threads[name] = threads.get(name, 0) + 1
  return {"device_thread_events": threads,
          "kernels": len(on_stream), "kernels_per_decode_step": len(on_stream) / max(decode_steps, 1),
          "matmul_kernels_per_decode_step": matmuls / max(decode_steps, 1),
          "matmul_fraction": matmul_s / busy if busy else None,
          "kernel_s": busy, "profiled_call_s": wall_s, "gpu_busy_fraction": busy / wall_s if wall_s else None,
          "top_kernels": [{"name": n, "count": c, "seconds": round(t, 5)} for n, (c, t) in top]}


def child_step(args, result: Result) -> None:
  import jax

  import memory_fit
  from grpo_jax.train.timing import seconds_since_launch
  cache = enable_cache(args.scratch)
  clock = CompileClock()
  cfg, config = recipe_at(args.model, args.smoke, **({"attention": args.attention} if args.attention else {}))
  if args.plan:
    cfg, config = with_update_plan(cfg, config, jax.devices()[0].device_kind, result)
  B, P, C, _, micro = memory_fit.shapes(config)
  result.update(model=args.model, recipe=RECIPE, attention=config.model.attention,
                device=jax.devices()[0].device_kind, rows=B, prompt_len=P,
                new_tokens=C, micro_batch=micro, beta=config.grpo.beta, remat=bool(cfg.remat), dtype=str(cfg.dtype),
                param_dtype=str(cfg.param_dtype), cache_entries_before=len(os.listdir(cache))
                if os.path.isdir(cache) else 0)
  step, abstract_params, abstract_opt, graphdef, optimizer = memory_fit.build_update(cfg, config)
  rig = memory_fit.StepRig(cfg, config, step, graphdef, optimizer, log=progress)
  result.update(state_peak_bytes=memory_fit.peak_in_use())
  steps = []
  for i in range(1, args.steps + 1):
    steps.append(rig.run_step(i, data_step=1))  # the same prompts: the same widths, no recompilation
    progress(f"step {i}: " + ", ".join(f"{k} {steps[-1][k]:.2f}" for k in ("sample_s", "reference_s", "update_s")))
    if i == 1:
      result.update(launch_to_first_step_s=seconds_since_launch(), first_step_s=steps[0]["step_s"],
                    compile_s=clock.compile_s, compiles=clock.compiles, cache_loads=clock.cache_loads)
    later = steps[1:] or steps
    result.update(steps=steps, update_prompt_width=steps[-1]["prompt_width"],
                  update_completion_width=steps[-1]["completion_width"],
                  median={k: median([s[k] for s in later]) for k in ("sample_s", "reference_s", "update_s", "step_s")},
                  peak_bytes=max((s["update_peak"] or 0) for s in steps) or None)
  if args.steps > 1:
    prompts = sampler_prompts(rig, steps[-1])
    result.update(time_sampler(rig, prompts, calls=2))
    progress(f"sampler alone: {result['sampler_tokens_per_s']:,.0f} tokens/s")
    if args.profile:
      result.update(profile_sampler(rig, prompts, args.out, args.scratch))
      # A token step runs L x 7 projections (q, k, v, o, gate, up, down) and the LM head; XLA's dot merger can
      # join those that share their input (q/k/v, gate/up): L x 4 + 1. The profile says which one the GPU ran.
      L = cfg.num_layers
      result.update(matmuls_per_token_unmerged=7 * L + 1, matmuls_per_token_merged=4 * L + 1)
      result.update(profile_update(rig, args.steps + 1, args.out, args.scratch))
      progress(f"update profile: {result['update_profile'].get('kernels')} kernels")
      progress(f"profile: {result.get('kernels_per_decode_step')} kernels per decode step")
    result.update(xla_update_bytes=memory_fit.compiled_update_bytes(step, abstract_params, abstract_opt, config))


def with_update_plan(cfg, config, device_kind: str, result: Result):
  """(cfg, config) with the update's micro-batch size and remat that roofline.choose_update_plan picks for this
  device (an H100's plan on a device roofline.py has no figures for, as on a CPU in --smoke)."""
  import roofline
  device = roofline.device_peak(device_kind) or "H100 SXM"
  w = roofline.config_workload(config)
  plan = roofline.choose_update_plan(roofline.update_plans(cfg, roofline.num_params(cfg), w), device)
  if plan is None:
    raise SystemExit(f"roofline.py: no micro-batch fits {device} for {RECIPE}")
  config.grpo.micro_batch_size, config.model.remat = plan["micro_batch"], plan["remat"]
  result.update(update_plan={"device": device, "micro_batch": plan["micro_batch"], "remat": plan["remat"],
                             "estimate_gib": round(plan["memory"] / 2 ** 30, 2),
                             "floor_s": round(plan["floor_s"][device], 4),
                             "recipe": {"micro_batch": w.micro_batch, "remat": w.remat}})
  progress(f"update plan for {device}: micro-batch {plan['micro_batch']}, remat {plan['remat']}")
  return cfg.replace(remat=plan["remat"]), config


def child_sampler(args, result: Result) -> None:
  """The sampler alone at the recipe's shapes (no update is compiled): tokens/s under this process's XLA_FLAGS,
  `--decode-segment` and `--decode-attention` (with "pallas", first the kernel against the einsum path)."""
  import jax

  import memory_fit
  cfg, config = recipe_at(args.model, args.smoke, decode_attention=args.decode_attention)
  config.sampling.decode_segment = args.decode_segment
  if args.decode_attention == "pallas":
    result.update(pallas_vs_einsum=decode_kernel_check(cfg, config))
  step, _, _, graphdef, optimizer = memory_fit.build_update(cfg, config)  # traced lazily: nothing compiles
  rig = memory_fit.StepRig(cfg, config, step, graphdef, optimizer, log=progress)
  if args.stop_check_every:
    rig.sampler.sampler.stop_check_every = args.stop_check_every  # read when the decode is traced, below
  G = config.grpo.group_size
  prompts = sampler_prompts(rig, {"prompt_tokens": 150 * config.grpo.prompts_per_step * G})
  result.update(model=args.model, xla_flags=os.environ.get("XLA_FLAGS", ""), device=jax.devices()[0].device_kind,
                decode_segment=args.decode_segment, decode_attention=cfg.decode_attention,
                stop_check_every=rig.sampler.sampler.stop_check_every)
  result.update(time_sampler(rig, prompts, calls=3))


def decode_kernel_check(cfg, config) -> dict:
  """The Pallas decode kernel against the einsum reference on random bf16 inputs of the recipe's cache shape,
  half of it filled: max abs difference and each one's seconds per call (one layer, one token step)."""
  import jax
  import jax.numpy as jnp

  from grpo_jax.model import decode_attention as kernel
  B = config.grpo.prompts_per_step * config.grpo.group_size
  S = config.sampling.max_prompt_length + config.sampling.max_new_tokens
  K, Q, H = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (B, K, Q, H), jnp.bfloat16)
  k = jax.random.normal(keys[1], (B, K, H, S), jnp.bfloat16)
  v = jax.random.normal(keys[2], (B, K, S, H), jnp.bfloat16)
  ok = jax.random.uniform(keys[3], (B, S)) > 0.1
  length = jnp.int32(S // 2)
  fast = jax.jit(lambda *a: kernel.decode_attention(*a, scale=cfg.attention_scale))
  slow = jax.jit(lambda *a: kernel.reference_decode_attention(*a, scale=cfg.attention_scale))
  out, last = {"shape_BxKxQxHxS": [B, K, Q, H, S], "filled": int(length)}, {}
  for name, fn in (("pallas", fast), ("einsum", slow)):
    fn(q, k, v, ok, length).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(20):
      last[name] = fn(q, k, v, ok, length)
    last[name].block_until_ready()
    out[f"{name}_us"] = round((time.perf_counter() - t0) / 20 * 1e6, 1)
  diff = jnp.abs(last["pallas"].astype(jnp.float32) - last["einsum"].astype(jnp.float32))
  out["max_abs_diff"] = float(jnp.max(diff))
  return out


def child_head(args, result: Result) -> None:
  """benchmarks/head_backward_bench.py at one micro-batch of the recipe: its rows, new tokens, chunk, model shape."""
  import head_backward_bench
  cfg, config = recipe_at(args.model, args.smoke)
  result.update(head_backward_bench.measure(
      rows=config.grpo.micro_batch_size, positions=config.sampling.max_new_tokens, hidden=cfg.hidden_size,
      vocab=cfg.vocab_size, chunk=config.model.logprob_chunk_size, repeats=5))


def child_moe(args, result: Result) -> None:
  """benchmarks/moe_bench.py at Qwen3-30B-A3B's layer shape (8 of its 48 layers, a 32k vocabulary), bf16."""
  import moe_bench
  shape = (dict(experts=8, k=2, expert_size=16, rows=4, new_tokens=4, hidden=32, layers=2, heads=4, vocab=64)
           if args.smoke else dict(experts=128, k=8, expert_size=768, rows=64, new_tokens=128, hidden=2048, layers=8,
                                   heads=32, vocab=32768, dtype="bfloat16"))
  result.update(shape=shape, **moe_bench.measure(**shape, repeats=3, impls=("ragged", "blocks")))


def child_continuous(args, result: Result) -> None:
  """benchmarks/continuous_batching_bench.py: geometric lengths (mean ~256 tokens, cut at 1024) over 256 rows."""
  import continuous_batching_bench
  shape = (dict(prompts=4, group=2, slots=4, new_tokens=16, stop_ids=64) if args.smoke else
           dict(prompts=32, group=8, slots=128, new_tokens=1024, stop_ids=4))
  out = continuous_batching_bench.measure(**shape, repeats=3)
  result.update(shape=shape, **{k: v for k, v in out.items() if k != "lengths"},
                lengths=dict(mean=float(out["lengths"].mean()), max=int(out["lengths"].max())))


def child_trl(args, result: Result) -> None:
  """TRL's GRPOTrainer on a random checkpoint of the named shape, the recipe's settings and prompts."""
  import torch
  import transformers

  import memory_fit
  from grpo_jax import testing
  from grpo_jax.commands import memory_estimate
  from step_bench import trl_step_records
  _, config = recipe_at(args.model, args.smoke)
  shape = memory_estimate.PRESETS[args.model]
  if args.smoke:
    shape = dict(shape, num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
                 vocab_size=1024)
  hf = transformers.Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                                intermediate_size=shape["intermediate_size"],
                                num_hidden_layers=shape["num_layers"], num_attention_heads=shape["num_heads"],
                                num_key_value_heads=shape["num_kv_heads"], tie_word_embeddings=True,
                                max_position_embeddings=32768, rope_theta=1e6)
  paths = testing.ensure_fixtures()
  model_dir = os.path.join(args.scratch, "trl_model")
  shutil.rmtree(model_dir, ignore_errors=True)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  with torch.device(device):
    model = transformers.Qwen2ForCausalLM(hf)
  model.save_pretrained(model_dir)
  del model
  for name in os.listdir(paths["checkpoint"]):  # the fixture's tokenizer (every row decodes all tokens anyway)
    if "token" in name or name.endswith(".jinja"):
      shutil.copy(os.path.join(paths["checkpoint"], name), model_dir)
  config.model.hf_path = model_dir
  config.task.train_path, config.task.heldout_path = paths["gsm8k"], ""
  B, P, C, _, micro = memory_fit.shapes(config)
  result.update(model=args.model, rows=B, prompt_len=P, new_tokens=C, micro_batch=micro, device=device,
                trl=__import__("trl").__version__)
  records = trl_step_records(config, args.steps, args.scratch, "bfloat16", 0, device=device)
  later = [r["seconds"] for r in records["steps"] if r["step"] >= 2] or [r["seconds"] for r in records["steps"]]
  result.update(records, median_step_s=median(later))


def child_tests(args, result: Result) -> None:
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  workers = "1" if args.smoke else "8"
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", workers, "--dist", "loadfile", "-p",
                         "no:cacheprovider", *args.paths], cwd=ROOT, env=env, capture_output=True, text=True)
  lines = proc.stdout.strip().splitlines()
  result.update(rc=proc.returncode, summary=lines[-1] if lines else proc.stderr[-300:],
                failures=[l for l in lines if l.startswith(("FAILED", "ERROR"))][:40])
  if proc.returncode not in (0, 1):
    raise SystemExit(proc.returncode)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.environ.get("OUT") or "/tmp/gpu_campaign",
                 help="where the results go: campaign.json, campaign.md, campaign.log, decode_profile.json.gz")
  p.add_argument("--scratch", default="/tmp/gpu_campaign_scratch",
                 help="the compilation cache, the profile, TRL's checkpoint, each part's own JSON")
  p.add_argument("--budget", type=float, default=550.0,
                 help="seconds for all parts together (a call of at most 10 minutes can take 560)")
  p.add_argument("--smoke", action="store_true", help="tiny shapes: a check of the whole campaign on a CPU")
  p.add_argument("--only", default="", help="comma-separated part names (default: all)")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--result", help=argparse.SUPPRESS)
  p.add_argument("kind", nargs="?", choices=("step", "sampler", "head", "trl", "tests", "moe", "continuous"),
                 help=argparse.SUPPRESS)
  p.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
  p.add_argument("--model", default="qwen2.5-0.5b", help=argparse.SUPPRESS)
  p.add_argument("--steps", type=int, default=3, help=argparse.SUPPRESS)
  p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--attention", default="", help=argparse.SUPPRESS)
  p.add_argument("--plan", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--decode-segment", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--stop-check-every", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--decode-attention", default="einsum", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if not args.child:
    return main_parent(args)
  if args.deadline > 10:  # a part about to be killed at its budget first says where it is
    faulthandler.dump_traceback_later(args.deadline - 5, exit=False)
  result = Result(args.result)
  {"step": child_step, "sampler": child_sampler, "head": child_head, "trl": child_trl, "tests": child_tests,
   "moe": child_moe, "continuous": child_continuous}[args.kind](args, result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
