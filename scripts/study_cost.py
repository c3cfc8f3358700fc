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
not measured: it prints the step time at which that node would cost as much per member as the first --price,
so any measured step below it makes that node the cheaper one. A step time measured on one accelerator says
nothing about another: measure before you trust a row. Standard library only (docs/cloud.md prints its tables
with this script).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys


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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--members", type=int, required=True, help="members of the study (variants x seeds)")
  parser.add_argument("--steps", type=int, help="GRPO steps per member")
  parser.add_argument("--step_s", type=float, help="measured seconds per step")
  parser.add_argument("--overhead_s", type=float, default=0.0,
                      help="seconds per member outside the steps: start, compile, evaluation, warm start")
  parser.add_argument("--member_s", type=float, help="measured seconds of a whole member (instead of --steps)")
  parser.add_argument("--per_node", type=int, default=1, help="members at once on one node (one per GPU)")
  parser.add_argument("--nodes", type=int, default=1, help="worker nodes")
  parser.add_argument("--head_price", type=float, default=0.0, help="USD per hour of the head node")
  parser.add_argument("--price", type=parse_price, action="append", required=True, metavar="LABEL=USD",
                      help="USD per node-hour (repeatable: one row each)")
  parser.add_argument("--compare", type=parse_price, action="append", default=[], metavar="LABEL=USD",
                      help="a node without a measured step time: print its break-even step time against the "
                           "first --price (needs --steps)")
  args = parser.parse_args(argv)
  try:
    member_s = member_seconds(args.steps, args.step_s, args.overhead_s, args.member_s)
    took = f" ({_duration(member_s / 3600)})" if member_s >= 60 else ""
    print(f"{args.members} members x {_seconds(member_s)} s each{took}, {args.per_node} per node")
    print()
    print(table(args.members, member_s, args.price, args.per_node, args.nodes, args.head_price))
    if args.compare:
      if args.steps is None:
        parser.error("--compare needs --steps and --step_s")
      ref_label, ref_price = args.price[0]
      print()
      print(f"| node (step time not measured) | USD per node-hour | same cost per member as {ref_label} at |")
      print("|---|---|---|")
      for label, price in args.compare:
        step = break_even_step_s(member_s, ref_price, price, args.steps, args.overhead_s, args.per_node,
                                 args.per_node)
        where = (f"{step:.1f} s per step ({step / args.step_s:.1f}x the measured {args.step_s:g} s)" if step > 0
                 else "never (the overhead alone costs more)")
        print(f"| {label} | {price:g} | {where} |")
  except ValueError as e:
    print(f"study_cost.py: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
