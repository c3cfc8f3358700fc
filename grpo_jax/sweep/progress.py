"""A study's progress read from its sweep directory: the live line while members run and the summary at the end.

Everything comes from the files a member's attempts write (grpo_jax/sweep/runner.py), so the same view works
whichever backend runs the members and from any machine that mounts the sweep directory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from typing import Iterable, Mapping, Sequence

from grpo_jax import storage
from grpo_jax.sweep import runner
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.metrics import read_jsonl


@dataclasses.dataclass(frozen=True)
class MemberProgress:
  name: str
  state: str            # queued, running, done, failed (or the runner's skipped-* outcomes)
  step: int             # last logged step (-1: none yet)
  num_steps: int        # from the member's config.json (0: not written yet)
  attempts: int
  wall_s: float         # all attempts, the running one included
  preempted: int = 0    # attempts that ended preempted (attempts.jsonl's outcome): retried apart from failures

  def remaining_s(self) -> float | None:
    """Seconds left at this member's pace so far (warm start and compilation included), None if unknown."""
    if self.state != "running" or self.step <= 0 or not self.num_steps:
      return None
    return max(self.num_steps - self.step, 0) * self.wall_s / self.step


def _last_step(workdir: str) -> int:
  try:
    lines = storage.read_tail(RunFiles(workdir).metrics, 4096).splitlines()
  except OSError:
    return -1
  for line in reversed(lines):
    with contextlib.suppress(ValueError, KeyError, TypeError):  # a line cut short, or one without a step
      return int(json.loads(line)["step"])
  return -1


def read_member(sweep_dir: str, name: str, outcome: str | None = None, now: float | None = None) -> MemberProgress:
  """A member's progress; `outcome` (the backend's word, e.g. 'skipped-done') wins over what the files say."""
  workdir = storage.join(sweep_dir, name)
  rows = read_jsonl(RunFiles(workdir).attempts)
  starts = [r["start"] for r in rows if "start" in r and "rc" not in r]
  ended = {r.get("start") for r in rows if "rc" in r}
  open_starts = [s for s in starts if s not in ended]
  wall_s = runner.previous_wall_s(workdir)
  disk = runner.status(workdir)
  state = outcome or (disk if disk in ("done", "failed") else "running" if open_starts else "queued")
  if state == "running" and open_starts:
    wall_s += (now or time.time()) - open_starts[-1]
  config = runner.read_json(RunFiles(workdir).config) or {}
  return MemberProgress(name, state, _last_step(workdir), int(config.get("num_steps", 0) or 0),
                        len(set(starts) | ended - {None}), wall_s,
                        sum(r.get("outcome") == "preempted" for r in rows))


def read_members(sweep_dir: str, members, outcomes: Mapping[str, str] | None = None) -> list[MemberProgress]:
  """`read_member` of each of the sweep's `members` (spec.Member), with its outcome from `outcomes` if any."""
  return [read_member(sweep_dir, m.name, (outcomes or {}).get(m.name)) for m in members]


def eta_s(members: Sequence[MemberProgress]) -> float | None:
  """Seconds until the last member ends: running members at their own pace, queued ones at the mean length of
  the members finished or projected so far, spread over as many slots as run now. None before any estimate."""
  running = [m for m in members if m.state == "running"]
  remaining = [r for r in (m.remaining_s() for m in running) if r is not None]
  lengths = [m.wall_s for m in members if m.state in ("done", "skipped-done") and m.wall_s > 0]
  lengths += [m.wall_s + r for m, r in ((m, m.remaining_s()) for m in running) if r is not None]
  queued = sum(m.state == "queued" for m in members)
  if queued and not lengths or running and not remaining:
    return None
  mean = sum(lengths) / len(lengths) if lengths else 0.0
  slots = max(len(running), 1)
  return max(max(remaining, default=0.0), (sum(remaining) + queued * mean) / slots)


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  h, rem = divmod(seconds, 3600)
  return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def status_line(members: Sequence[MemberProgress]) -> str:
  """'[sweep] 2 queued, 1 running (a_seed0 step 12/50), 3 done, 0 failed; ~4m10s left', with ', 2 preempted'
  (attempts, retried apart from failures) after 'failed' once any attempt was preempted."""
  count = lambda *states: sum(m.state in states for m in members)  # noqa: E731
  running = [f"{m.name} step {max(m.step, 0)}/{m.num_steps or '?'}" for m in members if m.state == "running"]
  eta = eta_s(members)
  preempted = sum(m.preempted for m in members)
  return (f"[sweep] {count('queued')} queued, {count('running')} running"
          + (f" ({', '.join(running)})" if running else "")
          + f", {count('done', 'skipped-done')} done, {count('failed', 'skipped-failed')} failed"
          + (f", {preempted} preempted" if preempted else "")
          + (f"; ~{_duration(eta)} left" if eta is not None and count('queued', 'running') else ""))


def summary_table(members: Iterable[MemberProgress], wall_s: float) -> str:
  """One row per member (state, attempts, of which preempted, wall time of all its attempts) and the study's wall
  time, with the preemptions apart from the failures."""
  members = list(members)
  width = max([len(m.name) for m in members] + [6])
  lines = [f"{'member':<{width}}  {'state':<14} {'attempts':>8} {'preempted':>9} {'wall':>9}"]
  lines += [f"{m.name:<{width}}  {m.state:<14} {m.attempts:>8} {m.preempted:>9} {_duration(m.wall_s):>9}"
            for m in members]
  failed = sum(m.state in ("failed", "skipped-failed") for m in members)
  preempted = sum(m.preempted for m in members)
  lines.append(f"[sweep] {len(members)} members in {_duration(wall_s)}: {failed} failed, {preempted} "
               f"attempt{'s' * (preempted != 1)} preempted (retried apart from --max_attempts)")
  return "\n".join(lines)


class LiveLine:
  """One status line: rewritten in place on a terminal, else printed when it changes (at most every 30 s)."""

  def __init__(self, echo, every_s: float = 30.0):
    self.echo, self.every_s, self.tty = echo, every_s, sys.stdout.isatty() and echo is print
    self.last_key, self.last_time = None, 0.0

  def show(self, members: Sequence[MemberProgress]) -> None:
    """The members' `status_line`; a change of their states is printed at once."""
    line, key = status_line(members), sorted((m.state, m.preempted) for m in members)
    if self.tty:
      sys.stdout.write("\r\033[K" + line)
      sys.stdout.flush()
    elif key != self.last_key or time.time() - self.last_time >= self.every_s:
      self.echo(line)
      self.last_key, self.last_time = key, time.time()

  def end(self) -> None:
    if self.tty:
      sys.stdout.write("\n")
