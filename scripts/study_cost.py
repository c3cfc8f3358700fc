#!/usr/bin/env python
"""Accelerator-hours, wall-clock and cost of a study on a cluster, from a step time you measured.

  python scripts/study_cost.py --members 40 --steps 500 --step_s 6.1 --overhead_s 60 --nodes 8 \\
      --price "GCP a3-highgpu-1g, us-central1=5.38" --compare "GCP g2-standard-8 (1 x L4)=0.85"

A member takes `steps * step_s + overhead_s` seconds (or --member_s, when a whole member was timed). `per_node`
members run at once on one node (one per GPU of the node), on `nodes` nodes, and the queue drains in waves:
wall-clock = ceil(members / (nodes * per_node)) * member time. Two costs per price (USD per node-hour):
  busy: node-hours the members keep busy (members * member time / per_node), what an autoscaling cluster
        that removes idle nodes pays, boot and idle timeout aside;
  held: nodes * wall-clock, what a fixed cluster pays from the first member to the last.
--head_price adds a head node for the wall-clock to both. --compare prices a node whose step time you have
not measured: it prints the step time at which that node would cost as much per member as the first row,
so any measured step below it makes that node the cheaper one. A step time measured on one accelerator says
nothing about another: measure before you trust a row.

Spot and preemptible capacity: --spot_price LABEL=USD gives the spot price of the --price row of that label, and
--node KEY takes both prices of a node from the published figures built in here (--list_prices shows them, with
where and when they were read). A second table then prices the study on spot nodes, given how often a node is
reclaimed (--preemptions_per_h, per node-hour: no published rate is built in) and what a preemption costs: the
restart (--restart_s: a new VM or pod, install, model load, compile, checkpoint restore) plus the work lost.
A trainer that saves the last completed step on SIGTERM loses the step in flight, step_s / 2 on average; one
that does not loses what it did since its last checkpoint, checkpoint_every * step_s / 2 on average. Then
  extra time = preemptions_per_h * (restart_s + lost_s) / 3600   (a fraction of the work, first order)
  spot cost  = spot price * node-hours * (1 + extra time)
and spot stays the cheaper one while preemptions_per_h < (price / spot price - 1) * 3600 / (restart_s + lost_s).
Standard library only (docs/cloud.md prints its tables with this script).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys


# Published prices, USD per node-hour: (label, on-demand, spot, source, date read). SkyPilot's catalog
# (github.com/skypilot-org/skypilot-catalog, catalogs/v8) lists a GCP GPU VM as its machine row plus its GPU row,
# summed here, and AWS spot prices per availability zone, of which the dearest in the region is kept here. The
# catalog does not record when it was crawled; spot prices move (GCP's up to once a day, AWS's gradually).
_SKYPILOT_GCP = "SkyPilot catalog gcp/vms.csv @8427bbf"
_SKYPILOT_AWS = "SkyPilot catalog aws/vms.csv @e385a0d"
PUBLISHED = {
    "a3-highgpu-1g/us-central1": ("a3-highgpu-1g (1 x H100), us-central1", 5.38327, 3.19416, _SKYPILOT_GCP,
                                  "2026-11-26"),     # H100 4.20076 / 2.8501 + machine 1.18251 / 0.34406
    "a3-highgpu-1g/us-east4": ("a3-highgpu-1g (1 x H100), us-east4", 10.97906, 2.38616, _SKYPILOT_GCP,
                               "2026-11-26"),        # H100 9.79655 / 2.1291 + machine 1.18251 / 0.25706
    "a2-highgpu-1g/us-central1": ("a2-highgpu-1g (1 x A100 40 GB), us-central1", 3.67339, 1.80385, _SKYPILOT_GCP,
                                  "2026-11-26"),     # A100 2.93391 / 1.4341 + machine 0.73948 / 0.36975
    "v5litepod-4/us-west4": ("TPU v5litepod-4 (4 x v5e), us-west4", 4.8, 1.92, _SKYPILOT_GCP, "2026-11-26"),
    "v5litepod-4/us-central1": ("TPU v5litepod-4 (4 x v5e), us-central1", 4.8, 0.9797, _SKYPILOT_GCP, "2026-11-26"),
    "p5.48xlarge/us-east-2": ("p5.48xlarge (8 x H100), us-east-2", 55.04, 17.2949, _SKYPILOT_AWS,
                              "2026-11-26"),         # spot 15.06 to 17.2949 in the region's three zones
    "g6.xlarge/us-east-1": ("g6.xlarge (1 x L4), us-east-1", 0.8048, 0.4386, _SKYPILOT_AWS,
                            "2026-11-26"),           # spot 0.4007 to 0.4386 in four zones
}


@dataclasses.dataclass(frozen=True)
class Estimate:
  member_s: float        # one member, start to end
  node_hours: float      # node-hours the members keep busy
  waves: int             # rounds of `nodes * per_node` members
  wall_h: float          # first member to last
  cost_busy: float       # node_hours * price (+ head for wall_h)
  cost_held: float       # nodes * wall_h * price (+ head for wall_h)


def member_seconds(steps: int | None = None, step_s: float | None = None, overhead_s: float = 0.0,
                   member_s: float | None = None) -> float:
  """Seconds of one member: a timed member, or steps * step_s + overhead_s."""
  if member_s is not None:
    if steps is not None or step_s is not None:
      raise ValueError("give either member_s or steps and step_s, not both")
    if member_s <= 0:
      raise ValueError(f"member_s must be > 0, got {member_s}")
    return float(member_s)
  if steps is None or step_s is None:
    raise ValueError("give steps and step_s (or member_s)")
  if steps < 1 or step_s <= 0 or overhead_s < 0:
    raise ValueError(f"need steps >= 1, step_s > 0, overhead_s >= 0; got {steps}, {step_s}, {overhead_s}")
  return steps * step_s + overhead_s


def estimate(members: int, member_s: float, price: float, per_node: int = 1, nodes: int = 1,
             head_price: float = 0.0) -> Estimate:
  if members < 1 or per_node < 1 or nodes < 1:
    raise ValueError(f"members, per_node and nodes must be >= 1; got {members}, {per_node}, {nodes}")
  if price < 0 or head_price < 0:
    raise ValueError("prices must be >= 0")
  node_hours = members * member_s / per_node / 3600
  waves = math.ceil(members / (nodes * per_node))
  wall_h = waves * member_s / 3600
  head = head_price * wall_h
  return Estimate(member_s, node_hours, waves, wall_h, node_hours * price + head, nodes * wall_h * price + head)


def break_even_step_s(member_s_ref: float, price_ref: float, price: float, steps: int, overhead_s: float = 0.0,
                      per_node_ref: int = 1, per_node: int = 1) -> float:
  """The step time at which a member on a node of `price` costs as much as one on the reference node (measured:
  `member_s_ref` seconds, `per_node_ref` members per node). Negative: it cannot, even at no time per step."""
  if price <= 0:
    raise ValueError("price must be > 0")
  cost_ref = member_s_ref / 3600 * price_ref / per_node_ref
  return (cost_ref / price * per_node * 3600 - overhead_s) / steps


def lost_work_s(step_s: float, checkpoint_every: int, saves_on_sigterm: bool = True) -> float:
  """Mean seconds of work a preemption throws away: a trainer that saves the last completed step on SIGTERM
  loses the step in flight (half a step on average); one that does not loses half a checkpoint interval."""
  if step_s <= 0 or checkpoint_every < 1:
    raise ValueError(f"need step_s > 0 and checkpoint_every >= 1; got {step_s}, {checkpoint_every}")
  return step_s / 2 if saves_on_sigterm else checkpoint_every * step_s / 2


def preemption_overhead(preemptions_per_h: float, restart_s: float, lost_s: float) -> float:
  """Extra node time as a fraction of the work: each preemption costs a restart plus the lost work. First order
  in the rate (the redone work can be preempted too, which adds about the square of this)."""
  if preemptions_per_h < 0 or restart_s < 0 or lost_s < 0:
    raise ValueError(f"preemptions_per_h, restart_s and lost_s must be >= 0; got {preemptions_per_h}, "
                     f"{restart_s}, {lost_s}")
  return preemptions_per_h * (restart_s + lost_s) / 3600


def spot_cost(node_hours: float, spot_price: float, overhead: float) -> float:
  return node_hours * (1 + overhead) * spot_price


def break_even_preemptions_per_h(price: float, spot_price: float, restart_s: float, lost_s: float) -> float:
  """The preemption rate (per node-hour) at which spot costs as much as on-demand: spot is the cheaper one below
  it. 0: spot is not cheaper even without preemptions; inf: preemptions cost nothing."""
  if spot_price <= 0:
    raise ValueError("spot price must be > 0")
  if spot_price >= price:
    return 0.0
  per_preemption_h = (restart_s + lost_s) / 3600
  return math.inf if per_preemption_h == 0 else (price / spot_price - 1) / per_preemption_h


def parse_price(text: str) -> tuple[str, float]:
  """'LABEL=USD' (the label may hold '=' itself; the number is after the last one)."""
  label, sep, value = text.rpartition("=")
  try:
    number = float(value)
  except ValueError:
    number = None
  if not sep or not label.strip() or number is None or number < 0:
    raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=USD_PER_NODE_HOUR, e.g. 'g2-standard-8=0.85'")
  return label.strip(), number


def _seconds(s: float) -> str:
  return f"{s:,.0f}" if s >= 100 else f"{s:g}"


def _duration(hours: float) -> str:
  minutes = round(hours * 60)
  return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def table(members: int, member_s: float, prices: list[tuple[str, float]], per_node: int, nodes: int,
          head_price: float = 0.0) -> str:
  lines = [f"| node | USD per node-hour | node-hours | wall-clock on {nodes} node(s) | cost (busy) | "
           f"cost ({nodes} held) |",
           "|---|---|---|---|---|---|"]
  for label, price in prices:
    e = estimate(members, member_s, price, per_node, nodes, head_price)
    lines.append(f"| {label} | {price:g} | {e.node_hours:.1f} | {_duration(e.wall_h)} | "
                 f"${e.cost_busy:,.2f} | ${e.cost_held:,.2f} |")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Node:
  label: str
  price: float                 # on-demand USD per node-hour
  spot: float | None = None    # spot (or preemptible) USD per node-hour
  source: str = "command line"


def nodes_from_args(prices: list[tuple[str, float]], spot_prices: list[tuple[str, float]],
                    keys: list[str]) -> list[Node]:
  """--price rows (with the --spot_price of the same label) then --node rows from PUBLISHED."""
  spot = {}
  labels = {label for label, _ in prices}
  for label, value in spot_prices:
    if label not in labels:
      raise ValueError(f"--spot_price {label!r} has no --price of that label: give its on-demand price as "
                       f"--price '{label}=USD' too")
    if value <= 0:
      raise ValueError(f"--spot_price {label!r} must be > 0")
    spot[label] = value
  nodes = [Node(label, price, spot.get(label)) for label, price in prices]
  for key in keys:
    if key not in PUBLISHED:
      raise ValueError(f"unknown --node {key!r}; known: {', '.join(PUBLISHED)} (--list_prices shows them)")
    label, price, spot_price, source, read = PUBLISHED[key]
    nodes.append(Node(label, price, spot_price, f"{source}, read {read}"))
  if not nodes:
    raise ValueError("no prices: give --price LABEL=USD (with --spot_price LABEL=USD) or --node KEY")
  return nodes


def published_table() -> str:
  lines = ["| --node | node | USD per node-hour | spot | spot / on-demand | from | read |",
           "|---|---|---|---|---|---|---|"]
  for key, (label, price, spot, source, read) in PUBLISHED.items():
    lines.append(f"| {key} | {label} | {price:g} | {spot:g} | {spot / price:.0%} | {source} | {read} |")
  return "\n".join(lines)


def spot_table(members: int, member_s: float, nodes: list[Node], per_node: int, preemptions_per_h: float,
               restart_s: float, step_s: float, checkpoint_every: int) -> str:
  """The study on spot nodes beside on-demand (workers only, busy node-hours), with and without the trainer's
  save on SIGTERM."""
  lost = {saves: lost_work_s(step_s, checkpoint_every, saves) for saves in (True, False)}
  extra = {saves: preemption_overhead(preemptions_per_h, restart_s, lost[saves]) for saves in lost}
  node_hours = members * member_s / per_node / 3600
  lines = [f"Spot: {preemptions_per_h:g} preemptions per node-hour, each costing a {_seconds(restart_s)} s restart "
           f"plus the work lost, {_seconds(lost[True])} s when the trainer saves on SIGTERM (half a step) or "
           f"{_seconds(lost[False])} s when it does not (half of {checkpoint_every} steps): "
           f"{extra[True]:.1%} or {extra[False]:.1%} more node-hours. Costs of the node-hours the workers keep busy; "
           f"the last column is the rate at which spot, saved on SIGTERM, costs as much as on-demand.",
           "",
           "| node | USD per node-hour | spot | prices from | on-demand | spot, saved on SIGTERM | "
           "spot, not saved | spot is dearer above |",
           "|---|---|---|---|---|---|---|---|"]
  for n in nodes:
    if n.spot is None:
      continue
    cells = []
    for saves in (True, False):
      cost = spot_cost(node_hours, n.spot, extra[saves])
      cells.append(f"${cost:,.2f} (preemptions ${cost - node_hours * n.spot:,.2f})")
    rate = break_even_preemptions_per_h(n.price, n.spot, restart_s, lost[True])
    where = ("never" if rate == math.inf else "always (spot is not cheaper)" if rate == 0
             else f"{rate:.3g} preemptions per node-hour")
    lines.append(f"| {n.label} | {n.price:g} | {n.spot:g} | {n.source} | ${node_hours * n.price:,.2f} | "
                 f"{cells[0]} | {cells[1]} | {where} |")
  return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    # A mistyped flag or value: one line naming it, exit 2, as every script here (no usage dump).
    print(f"study_cost.py: error: {message} (--help lists the flags)", file=sys.stderr)
    sys.exit(2)


def main(argv=None) -> int:
  parser = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--members", type=int, help="members of the study (variants x seeds)")
  parser.add_argument("--steps", type=int, help="GRPO steps per member")
  parser.add_argument("--step_s", type=float, help="measured seconds per step (with --member_s: for the spot table)")
  parser.add_argument("--overhead_s", type=float, default=0.0,
                      help="seconds per member outside the steps: start, compile, evaluation, warm start")
  parser.add_argument("--member_s", type=float, help="measured seconds of a whole member (instead of --steps)")
  parser.add_argument("--per_node", type=int, default=1, help="members at once on one node (one per GPU)")
  parser.add_argument("--nodes", type=int, default=1, help="worker nodes")
  parser.add_argument("--head_price", type=float, default=0.0, help="USD per hour of the head node")
  parser.add_argument("--price", type=parse_price, action="append", default=[], metavar="LABEL=USD",
                      help="on-demand USD per node-hour (repeatable: one row each)")
  parser.add_argument("--spot_price", type=parse_price, action="append", default=[], metavar="LABEL=USD",
                      help="spot or preemptible USD per node-hour of the --price row of the same label")
  parser.add_argument("--node", action="append", default=[], metavar="KEY",
                      help="a node of the published prices built in here, on-demand and spot (--list_prices)")
  parser.add_argument("--list_prices", action="store_true", help="print the built-in published prices and exit")
  parser.add_argument("--preemptions_per_h", type=float,
                      help="how often a spot node is reclaimed, per node-hour (your estimate: none is built in)")
  parser.add_argument("--restart_s", type=float,
                      help="seconds from a preemption to the next step: new VM or pod, install, model load, "
                           "compile, checkpoint restore")
  parser.add_argument("--checkpoint_every", type=int, default=100,
                      help="steps between checkpoints (config checkpoint.every): the work lost without a save on "
                           "SIGTERM")
  parser.add_argument("--compare", type=parse_price, action="append", default=[], metavar="LABEL=USD",
                      help="a node without a measured step time: print its break-even step time against the "
                           "first row, the first --price or else the first --node (needs --steps)")
  args = parser.parse_args(argv)
  try:
    if args.list_prices:
      print(published_table())
      return 0
    if args.members is None:
      raise ValueError("give --members (the study's member count), or --list_prices")
    nodes = nodes_from_args(args.price, args.spot_price, args.node)
    step_s = args.step_s if args.member_s is None else None
    member_s = member_seconds(args.steps, step_s, args.overhead_s, args.member_s)
    spot = [n for n in nodes if n.spot is not None]
    if spot:
      missing = [flag for flag, value in (("--preemptions_per_h", args.preemptions_per_h),
                                          ("--restart_s", args.restart_s), ("--step_s", args.step_s))
                 if value is None]
      if missing:
        raise ValueError(f"spot prices need {' and '.join(missing)}: how often a node is reclaimed, what a "
                         f"restart takes, and the step time (docs/cloud.md, \"On spot capacity\")")
    elif args.preemptions_per_h is not None or args.restart_s is not None:
      raise ValueError("--preemptions_per_h and --restart_s price spot nodes, and none has a spot price: give "
                       "--spot_price LABEL=USD for a --price row, or --node KEY")
    took = f" ({_duration(member_s / 3600)})" if member_s >= 60 else ""
    print(f"{args.members} members x {_seconds(member_s)} s each{took}, {args.per_node} per node")
    print()
    print(table(args.members, member_s, [(n.label, n.price) for n in nodes], args.per_node, args.nodes,
                args.head_price))
    if args.compare:
      if args.steps is None:
        raise ValueError("--compare needs --steps and --step_s")
      ref = nodes[0]
      print()
      print(f"| node (step time not measured) | USD per node-hour | same cost per member as {ref.label} at |")
      print("|---|---|---|")
      for label, price in args.compare:
        step = break_even_step_s(member_s, ref.price, price, args.steps, args.overhead_s, args.per_node,
                                 args.per_node)
        where = (f"{step:.1f} s per step ({step / args.step_s:.1f}x the measured {args.step_s:g} s)" if step > 0
                 else "never (the overhead alone costs more)")
        print(f"| {label} | {price:g} | {where} |")
    if spot:
      print()
      print(spot_table(args.members, member_s, nodes, args.per_node, args.preemptions_per_h, args.restart_s,
                       args.step_s, args.checkpoint_every))
  except ValueError as e:
    print(f"study_cost.py: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
