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
"""
from __future__ import annotations

import argparse
import math
from typing import NamedTuple


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


if __name__ == "__main__":
  main()
