"""Predicts the step time of synchronous, inline and overlapped rollouts (`rollout.staleness`,
`rollout.sampler_devices`) from measured phase times and a device split, before renting the devices.

  python benchmarks/async_sim.py                                   # the 0.5B GSM8K recipe on 8 H100s
  python benchmarks/async_sim.py --phases 2.3,0.1,0.7,3.1 --devices 8 --measured_on 1 --param_gb 0.99

The model (one step in the steady state; every phase data-parallel over its devices):

  phases measured on m devices: sampling S, rewards W (host), reference log-probs F, update U, the loop's other
  host time O (data, placement, logging).
  On n devices a device-bound phase takes  t(n) = t * m / n / e(n / m)  where e is the scaling efficiency
  (1: perfect), given at 8x and interpolated in log2 of the ratio: `--efficiency` for the update and the
  reference (large matmuls: near linear), `--sample_efficiency` for sampling, whose token steps are bound by
  memory latency once each device holds few rows (256 rows over 8 devices: 32 each), so it scales worse.

  sync / inline (all n devices):          T = O + S(n) + W + F(n) + U(n)
  overlapped (s sampler, n - s trainer):  T = O + F(n - s) + max(U(n - s), X + S(s) + W)

  overlapped on one shared pool:          T = O + S + W + F + U + X   (every phase timed on the whole pool)

The last form is for devices that are slices of one pool of compute, as XLA's virtual CPU devices are (they
share one intra-op thread pool): phases that overlap in time still queue for the same cores, so a split hides
nothing of the compute and the step costs what the synchronous one does, plus the copy. It is the form
benchmarks/async_bench.py can check on a CPU; the two-sided form above assumes each side owns its devices, as
accelerators do.

The overlapped form is this project's loop (grpo_jax/train/loop.py): the reference log-probs of batch t are
computed before update t is dispatched; the sampler then samples batch t + k during the update, after the new
parameters reach its devices (X = parameter bytes / `--transfer_gbps`: device to device, NVLink ~ 150 GB/s
effective for a 1-to-many copy; through host memory, PCIe ~ 20 GB/s). Inline staleness changes what is learned,
not the step time. The figures printed are predictions; benchmarks/async_bench.py checks the model against a
measurement on this machine's 2 CPU devices.

The decode, from a distribution of completion lengths L_1..L_B (`--lengths`: a lognormal preset or a file), one
token step of r rows taking t(r) = fixed + per_row * r (fixed: reading the weights and launching the step's
kernels, what bounds an accelerator's decode; per_row: each row's own compute and cache reads):

  static       every row of the batch until the longest stops:    D = max L * t(B)
  continuous   `sampling.slots` = s rows at once, a row that stops hands its slot to the next (list scheduling in
               row order): D = makespan * t(s), makespan >= sum L / s
  partial      continuous, and unfinished rows carry over to the next batch (rollouts spanning updates): in the
               steady state every slot is busy, D = sum L / s * t(s)

Its utilization, sum L / (rows x steps), is `sampling/slot_utilization`. The sampling phase is then the prefill
(`--prefill`) plus D, and the step follows the forms above, the weight copy X included (the best layout of each).
`decode_modes` gives the three for a length distribution; `--decode` sets t(r) on the phases' devices.
"""
from __future__ import annotations

import argparse
import heapq
import math
from typing import NamedTuple, Sequence

import numpy as np


class Phases(NamedTuple):
  """Seconds of one step's phases, measured on `devices` devices; `other`: the loop's own host time (data,
  placement, logging), which neither side overlaps."""
  sample: float
  reward: float
  reference: float
  update: float
  devices: int = 1
  other: float = 0.0


def scaled(seconds: float, measured_on: int, devices: int, efficiency_at_8x: float = 1.0) -> float:
  """A device-bound phase's seconds on `devices` devices, from `seconds` on `measured_on` (module docstring)."""
  ratio = devices / measured_on
  if ratio <= 1:
    return seconds / ratio
  efficiency = 1.0 - (1.0 - efficiency_at_8x) * min(math.log2(ratio) / 3.0, 1.0)
  return seconds / ratio / efficiency


def sync_step(p: Phases, devices: int, efficiency: float = 1.0, sample_efficiency: float = 1.0) -> float:
  s = lambda t, e: scaled(t, p.devices, devices, e)
  return p.other + s(p.sample, sample_efficiency) + p.reward + s(p.reference, efficiency) + s(p.update, efficiency)


def overlapped_step(p: Phases, devices: int, sampler_devices: int, transfer_s: float, efficiency: float = 1.0,
                    sample_efficiency: float = 1.0) -> float:
  trainer = devices - sampler_devices
  s = lambda t, n, e: scaled(t, p.devices, n, e)
  return p.other + s(p.reference, trainer, efficiency) + max(
      s(p.update, trainer, efficiency), transfer_s + s(p.sample, sampler_devices, sample_efficiency) + p.reward)


def shared_pool_step(p: Phases, transfer_s: float = 0.0) -> float:
  """The overlapped step when both sides draw on one pool of compute (module docstring): the phases, each timed
  on the whole pool, add up as in the synchronous step."""
  return p.other + p.sample + p.reward + p.reference + p.update + transfer_s


class Decode(NamedTuple):
  """One token step of r rows takes fixed_s + per_row_s * r seconds (module docstring)."""
  fixed_s: float
  per_row_s: float

  def step_s(self, rows: int) -> float:
    return self.fixed_s + self.per_row_s * rows


# Completion lengths (lognormal: median, sigma; capped at max_new_tokens) of the two cases the docs quote. Assumed,
# not measured here: a 0.5B instruct model's GSM8K answers run a few hundred tokens; a reasoning model's a few
# thousand, with a tail to the cap (DeepSeek-R1-style training).
LENGTH_PRESETS = {"gsm8k": (180.0, 0.5, 512), "longtail": (1500.0, 1.0, 16384)}


def lognormal_lengths(median: float, sigma: float, cap: int, rows: int, seed: int = 0) -> np.ndarray:
  """[rows] completion lengths: lognormal(log median, sigma) rounded up, in [1, cap]."""
  draws = np.random.default_rng(seed).lognormal(math.log(median), sigma, rows)
  return np.clip(np.ceil(draws), 1, cap).astype(np.int64)


def makespan(lengths: Sequence[int], slots: int, every: int = 1) -> int:
  """Token steps for `slots` slots to decode rows of `lengths`, each row taking the first free slot, in order; a
  slot is refilled (and the decode ends) at a multiple of `every` steps (the sampler's `stop_check_every`)."""
  free = [0] * min(slots, len(lengths))
  for length in lengths:
    heapq.heappush(free, -(-(heapq.heappop(free) + int(length)) // every) * every)
  return max(free)


def decode_modes(lengths: Sequence[int], slots: int, decode: Decode) -> dict[str, tuple[float, float]]:
  """{mode: (decode seconds, slot utilization)} for static, continuous and partial decoding (module docstring)."""
  lengths = np.asarray(lengths)
  rows, total = len(lengths), float(lengths.sum())
  steps = {"static": (int(lengths.max()), rows), "continuous": (makespan(lengths, slots), slots),
           "partial": (total / slots, slots)}
  return {mode: (n * decode.step_s(r), total / (n * r)) for mode, (n, r) in steps.items()}


def with_decode(p: Phases, static_decode_s: float, decode_s: float) -> Phases:
  """`p` with its sampling's static decode (`static_decode_s` of it) replaced by `decode_s`."""
  return p._replace(sample=p.sample - static_decode_s + decode_s)


def table(p: Phases, devices: int, transfer_s: float, efficiency: float = 1.0,
          sample_efficiency: float = 1.0) -> list[tuple[str, float]]:
  """(layout, predicted step seconds): sync on all devices, then each split of the overlapped run."""
  rows = [(f"sync / inline, {devices} devices", sync_step(p, devices, efficiency, sample_efficiency))]
  for sampler in range(1, devices):
    rows.append((f"overlapped, sampler {sampler} + trainer {devices - sampler}",
                 overlapped_step(p, devices, sampler, transfer_s, efficiency, sample_efficiency)))
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  # The 0.5B GSM8K recipe's step on one H100 (docs/results.md, 2026-11-23): sampling 2.3 s, reference 0.7 s,
  # update 3.1 s of a 6.1 s step; rewards (GSM8K answer matching on the host) about 0.05 s.
  parser.add_argument("--phases", default="2.3,0.05,0.7,3.1", help="sample,reward,reference,update seconds")
  parser.add_argument("--measured_on", type=int, default=1, help="devices the phases were measured on")
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--param_gb", type=float, default=0.99, help="parameter bytes moved per step, GB "
                      "(Qwen2.5-0.5B in bfloat16: 494M x 2 bytes)")
  parser.add_argument("--transfer_gbps", type=float, default=150.0,
                      help="GB/s of the copy to the sampler's devices (NVLink ~150 effective; host PCIe ~20)")
  parser.add_argument("--efficiency", type=float, default=0.9,
                      help="the update's and the reference's scaling efficiency at 8x the devices (1: perfect)")
  parser.add_argument("--sample_efficiency", type=float, default=0.5,
                      help="sampling's scaling efficiency at 8x the devices (latency-bound token steps)")
  parser.add_argument("--lengths", default="gsm8k,longtail", help=f"completion-length presets {sorted(LENGTH_PRESETS)}")
  parser.add_argument("--rows", type=int, default=256, help="rows of a rollout batch (prompts x G)")
  parser.add_argument("--slots", type=int, default=128, help="continuous batching's slots (sampling.slots)")
  # 2.3 s for 256 rows x 512 token steps of the 0.5B model on one H100 (a random model: no row stopped): 4.5 ms a
  # step, taken here as a fixed 3.5 ms (weights and launches) plus 4 us per row.
  parser.add_argument("--decode", default="3.5,0.004", help="fixed,per_row milliseconds of one token step")
  parser.add_argument("--prefill", type=float, default=0.05, help="seconds of the sampling's prefill")
  args = parser.parse_args(argv)
  sample, reward, reference, update = map(float, args.phases.split(","))
  p = Phases(sample, reward, reference, update, args.measured_on)
  transfer_s = args.param_gb / args.transfer_gbps
  rows = table(p, args.devices, transfer_s, args.efficiency, args.sample_efficiency)
  base = rows[0][1]
  print(f"phases on {p.devices} device(s): sample {sample} s, reward {reward} s, reference {reference} s, update "
        f"{update} s; transfer {transfer_s * 1e3:.1f} ms ({args.param_gb} GB at {args.transfer_gbps} GB/s); "
        f"scaling efficiency at 8x: update and reference {args.efficiency}, sampling {args.sample_efficiency}")
  print(f"{'layout':<40} {'step s':>8} {'vs sync':>8}")
  for name, seconds in rows:
    print(f"{name:<40} {seconds:8.3f} {base / seconds:7.2f}x")
  best = min(rows[1:], key=lambda r: r[1]) if len(rows) > 1 else rows[0]
  print(f"recommended: {best[0]} ({base / best[1]:.2f}x the synchronous step)")
  fixed_ms, per_row_ms = map(float, args.decode.split(","))
  decode = Decode(fixed_ms / 1e3, per_row_ms / 1e3)
  print(f"\ndecode on {p.devices} device(s): a token step of r rows {fixed_ms} ms + {per_row_ms} ms x r; {args.rows} "
        f"rows, {args.slots} slots; sampling = prefill {args.prefill} s + the decode; the best of the layouts above")
  print(f"{'lengths (lognormal)':<42} {'mode':<11} {'decode s':>9} {'util':>6} {'step s':>8} {'vs static':>10}")
  for name in args.lengths.split(","):
    median, sigma, cap = LENGTH_PRESETS[name]
    label = f"{name}: median {median:g}, sigma {sigma:g}, cap {cap}"
    modes = decode_modes(lognormal_lengths(median, sigma, cap, args.rows), args.slots, decode)
    steps = {mode: min(seconds for _, seconds in table(p._replace(sample=args.prefill + decode_s), args.devices,
                                                          transfer_s, args.efficiency, args.sample_efficiency))
             for mode, (decode_s, _) in modes.items()}
    for mode, (decode_s, utilization) in modes.items():
      print(f"{label:<42} {mode:<11} {decode_s:9.3f} {utilization:6.2f} {steps[mode]:8.3f} "
            f"{steps['static'] / steps[mode]:9.2f}x")

if __name__ == "__main__":
  main()
