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
  pooled       an upper bound, not this project's mode: continuous, and unfinished rows carry over into one pool
               of slots that never idles (AReaL-style: a decode server that streams rows across updates):
               D = sum L / s * t(s)

Its utilization, sum L / (rows x steps), is `sampling/slot_utilization`. The sampling phase is then the prefill
(`--prefill`) plus D, and the step follows the forms above, the weight copy X included (the best layout of each).
`decode_modes` gives the three for a length distribution; `--decode` sets t(r) on the phases' devices.

Rollouts that span updates as built (`rollout.decode_budget` = b, `rollout.staleness` = k >= 1;
grpo_jax/train/partial.py): batch t takes one segment per policy, by the policies after p0 = max(0, t - 1 - k) ..
t - 1 updates, each segment one `Sampler.generate` call over the batch's rows still running: the first
prefills each group's prompt once and decodes at most b new tokens per row, segment j (2 .. k) prefills each
unfinished row's prompt and its (j - 1) b tokens so far again (no KV cache survives a segment) and decodes at
most b more, segment k + 1 (the policy after t - 1 updates) has no budget and finishes every row; a batch whose
rows all stop earlier needs no more. Before each update every batch in flight advances a segment, so in the
steady state a step runs segment j of some batch for each j = 1 .. k + 1 (those any row reaches), and with all
batches drawn from one length distribution (`segments`):

  segments     D = sum over j of  prefill(tokens_j) + steps_j x t(rows_j)
               rows_j: the rows longer than (j - 1) b (static: the sampler's row bucket of them; with slots s:
               min(s, rows), steps_j the makespan of their new tokens over s slots); steps_j: the longest row's
               new tokens in segment j less the one the prefill emits, rounded up to the decode loop's chunks of
               `stop_check_every` steps (the last chunk: the rest of max_new_tokens - 1); prefill(n tokens) =
               fixed + per_token x n (fixed: a generate call's own seconds, dispatch and host bookkeeping), n:
               prompts x prompt width for j = 1, rows_j x (prompt + (j - 1) b) after, each padded as the sampler
               pads them; the first segment's prefill may be given as measured (`--prefill`).

Overlapped, the finishing segment runs before the update (batch t must be complete) and the others during it:
T = O + F(n - s) + S_finish(s) + max(U(n - s), X + S_rest(s) + W). A step's k + 1 calls run one after the
other and each lasts as long as its longest row, so the step still runs about max L token steps (the longest
row's, split over its segments) plus a prefill per continued segment: where a token step is bound by reading the
weights (`fixed`), spanning saves only per-row work. The pooled bound's gain would need the batches' rows in one
decode. `--budget`, `--staleness`, `--prompt_tokens` and `--group` set the case; the per-token prefill cost is
`--prefill` over the first segment's prompt tokens. benchmarks/segments_bench.py checks the model against runs on
this CPU.
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
                    sample_efficiency: float = 1.0, serial: float = 0.0) -> float:
  """`serial`: the seconds of `p.sample` that run before the update instead of during it (with a decode budget:
  the segment that finishes the update's batch)."""
  trainer = devices - sampler_devices
  s = lambda t, n, e: scaled(t, p.devices, n, e)
  return p.other + s(p.reference, trainer, efficiency) + s(serial, sampler_devices, sample_efficiency) + max(
      s(p.update, trainer, efficiency),
      transfer_s + s(p.sample - serial, sampler_devices, sample_efficiency) + p.reward)


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


class Prefill(NamedTuple):
  """A prefill of n tokens (padding included) takes fixed_s + per_token_s * n seconds (module docstring)."""
  fixed_s: float
  per_token_s: float

  def seconds(self, tokens: int) -> float:
    return self.fixed_s + self.per_token_s * tokens


def makespan(lengths: Sequence[int], slots: int, every: int = 1) -> int:
  """Token steps for `slots` slots to decode rows of `lengths`, each row taking the first free slot, in order; a
  slot is refilled (and the decode ends) at a multiple of `every` steps (the sampler's `stop_check_every`)."""
  free = [0] * min(slots, len(lengths))
  for length in lengths:
    heapq.heappush(free, -(-(heapq.heappop(free) + int(length)) // every) * every)
  return max(free)


def decode_modes(lengths: Sequence[int], slots: int, decode: Decode) -> dict[str, tuple[float, float]]:
  """{mode: (decode seconds, slot utilization)} for static, continuous and pooled decoding (module docstring)."""
  lengths = np.asarray(lengths)
  rows, total = len(lengths), float(lengths.sum())
  steps = {"static": (int(lengths.max()), rows), "continuous": (makespan(lengths, slots), slots),
           "pooled": (total / slots, slots)}
  return {mode: (n * decode.step_s(r), total / (n * r)) for mode, (n, r) in steps.items()}


def chunked_steps(needed: int, max_new_tokens: int | None = None, every: int = 1) -> int:
  """Decode steps a generate call runs when its longest row needs `needed` after the prefill's token: the loop
  tests "every row done" before each chunk of `every` steps, its last chunk the rest of max_new_tokens - 1."""
  if needed <= 0:
    return 0
  steps = -(-needed // every) * every
  if max_new_tokens is None:
    return steps
  total = max_new_tokens - 1
  return steps if steps <= total // every * every else total


class Segment(NamedTuple):
  """One generate call of a batch in flight (`segments`)."""
  index: int           # j: the batch's j-th segment (1 starts it, k + 1 finishes it)
  rows: int            # rows it continues: those longer than (j - 1) b
  prefill_tokens: int  # tokens it prefills, padding included
  decode_steps: int
  decode_rows: int     # rows each decode step runs (static: the row bucket; with slots: the slots)
  decode_tokens: int   # kept tokens its decode steps emit (the prefill's one per row not counted)
  seconds: float


def segments(lengths: Sequence[int], budget: int, staleness: int, decode: Decode, prefill: Prefill, *,
             prompt_tokens: int = 0, group: int = 1, slots: int = 0, every: int = 1, max_new_tokens: int | None = None,
             row_bucket=None, width_bucket=None, first_prefill_s: float | None = None) -> list[Segment]:
  """The segments of one batch of completions of `lengths` with decode budget `budget` (0: one call to the end)
  and staleness k (module docstring): in the steady state a step runs one of each, so their seconds add up to
  the step's sampling. `group`: G, rows per prompt (the first segment prefills each prompt once);
  `prompt_tokens`: the longest prompt's tokens; `row_bucket(r)` / `width_bucket(w)`: the sampler's padding of
  r prompts or rows and of a context (prompt and tokens so far) of w tokens (none: exact); `slots`: continuous
  batching's slots (0: static); `every`, `max_new_tokens`: the decode loop's chunks (`chunked_steps`);
  `first_prefill_s`: the first segment's prefill seconds, if measured (else `prefill` of its tokens)."""
  lengths = np.asarray(lengths, np.int64)
  row_bucket = row_bucket or (lambda r: r)
  width_bucket = width_bucket or (lambda w: w)
  out = []
  for j in range(1, (staleness + 1 if budget else 1) + 1):
    done = (j - 1) * budget
    running = lengths > done
    rows = int(running.sum())
    if not rows:
      break
    new = lengths[running] - done
    if budget and j <= staleness:
      new = np.minimum(new, budget)
    prompts, repeats = (-(-rows // group), group) if j == 1 else (rows, 1)
    tokens = row_bucket(prompts) * width_bucket(prompt_tokens + done)
    prefill_s = first_prefill_s if j == 1 and first_prefill_s is not None else prefill.seconds(tokens)
    if slots:
      decode_rows = min(slots, rows)
      steps = makespan(new - 1, decode_rows, every)
    else:
      decode_rows = row_bucket(prompts) * repeats
      steps = chunked_steps(int(new.max()) - 1, max_new_tokens, every)
    seconds = prefill_s + steps * decode.step_s(decode_rows)
    out.append(Segment(j, rows, tokens, steps, decode_rows, int((new - 1).sum()), seconds))
  return out


def with_decode(p: Phases, static_decode_s: float, decode_s: float) -> Phases:
  """`p` with its sampling's static decode (`static_decode_s` of it) replaced by `decode_s`."""
  return p._replace(sample=p.sample - static_decode_s + decode_s)


def table(p: Phases, devices: int, transfer_s: float, efficiency: float = 1.0, sample_efficiency: float = 1.0,
          serial: float = 0.0) -> list[tuple[str, float]]:
  """(layout, predicted step seconds): sync on all devices, then each split of the overlapped run."""
  rows = [(f"sync / inline, {devices} devices", sync_step(p, devices, efficiency, sample_efficiency))]
  for sampler in range(1, devices):
    rows.append((f"overlapped, sampler {sampler} + trainer {devices - sampler}",
                 overlapped_step(p, devices, sampler, transfer_s, efficiency, sample_efficiency, serial)))
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
  parser.add_argument("--prompt_tokens", type=int, default=200, help="tokens of a prompt (assumed: a GSM8K "
                      "question in the chat template; the prefill's per-token cost is --prefill over them)")
  parser.add_argument("--group", type=int, default=8, help="rows per prompt (G): the first prefill's prompts")
  parser.add_argument("--budget", type=int, default=256, help="rollout.decode_budget of the segments modes")
  parser.add_argument("--staleness", type=int, default=1, help="rollout.staleness of the segments modes")
  parser.add_argument("--stop_check_every", type=int, default=8, help="the decode loop's chunk of steps")
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
  k, budget = args.staleness, args.budget
  # The first segment's prefill (each group's prompt once) is `--prefill`; a continued row's costs per token alike.
  prefill = Prefill(0.0, args.prefill / (-(-args.rows // args.group) * args.prompt_tokens))
  print(f"\ndecode on {p.devices} device(s): a token step of r rows {fixed_ms} ms + {per_row_ms} ms x r; {args.rows} "
        f"rows ({args.group} per prompt of {args.prompt_tokens} tokens), {args.slots} slots; sampling = prefill "
        f"{args.prefill} s ({prefill.per_token_s * 1e6:.2f} us/token) + the decode; segments: decode_budget "
        f"{budget}, staleness {k}, chunks of {args.stop_check_every} steps; the best of the layouts above")
  print(f"{'lengths (lognormal)':<42} {'mode':<15} {'sample s':>9} {'util':>6} {'step s':>8} {'vs static':>10}")
  for name in args.lengths.split(","):
    median, sigma, cap = LENGTH_PRESETS[name]
    label = f"{name}: median {median:g}, sigma {sigma:g}, cap {cap}"
    lengths = lognormal_lengths(median, sigma, cap, args.rows)
    # mode: (sampling seconds, utilization, the seconds of it that run before the update when overlapped)
    modes = {mode: (args.prefill + decode_s, utilization, 0.0)
             for mode, (decode_s, utilization) in decode_modes(lengths, args.slots, decode).items()}
    for mode, slots in (("segments", 0), ("segments+slots", args.slots)):
      segs = segments(lengths, budget, k, decode, prefill, prompt_tokens=args.prompt_tokens, group=args.group,
                      slots=slots, every=args.stop_check_every, max_new_tokens=cap, first_prefill_s=args.prefill)
      finishing = sum(seg.seconds for seg in segs if seg.index == k + 1)
      utilization = sum(seg.decode_tokens for seg in segs) / max(sum(seg.decode_steps * seg.decode_rows
                                                                     for seg in segs), 1)
      modes[mode] = (sum(seg.seconds for seg in segs), utilization, finishing)
    steps = {mode: min(seconds for _, seconds in table(p._replace(sample=sample_s), args.devices, transfer_s,
                                                          args.efficiency, args.sample_efficiency, serial))
             for mode, (sample_s, _, serial) in modes.items()}
    for mode, (sample_s, utilization, _) in modes.items():
      print(f"{label:<42} {mode:<15} {sample_s:9.3f} {utilization:6.2f} {steps[mode]:8.3f} "
            f"{steps['static'] / steps[mode]:9.2f}x")


if __name__ == "__main__":
  main()
