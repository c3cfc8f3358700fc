"""Runs sweep members one after another, each in its own workdir, and records how each run ended.

Files in a member's workdir (SWEEP_DIR/<name>/) besides what the trainer writes:
  member.json     the member (name, group, overrides) and the exact trainer command,
  train.log       the trainer's stdout and stderr, appended to by every attempt,
  attempts.jsonl  one line per attempt: start time, wall seconds, exit code,
  DONE            written after the trainer exited with code 0: the member is finished and is skipped from then on,
  FAILED          written after a non-zero exit: exit code and the tail of that attempt's log. A failed member is
                  re-run by the next `scripts/sweep.py` (the trainer resumes from its latest checkpoint) unless
                  --skip_failed is given; the new attempt removes FAILED when it starts.
A member with neither marker is unfinished (never started, still running, or killed) and is (re)run.
The trainer's own completion marker, `summary.json` (written by scripts/train.py after its last step), also
counts as finished, so runs launched with the bare trainer commands (`--print_format=train`) are reported too.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any, Mapping, Sequence

from grpo_jax.ablation import spec as spec_lib
from grpo_jax.train.metrics import read_jsonl

DONE, FAILED, TRAINER_SUMMARY = "DONE", "FAILED", "summary.json"
MEMBER_JSON, LOG, ATTEMPTS, SWEEP_JSON = "member.json", "train.log", "attempts.jsonl", "sweep.json"
ERROR_TAIL_LINES = 30


def member_dir(sweep_dir: str, member: spec_lib.Member) -> str:
  return os.path.join(sweep_dir, member.name)


def status(workdir: str) -> str:
  """'done', 'failed', 'unfinished' (has a log or metrics but no marker) or 'pending' (never started)."""
  if os.path.exists(os.path.join(workdir, DONE)):
    return "done"
  if os.path.exists(os.path.join(workdir, FAILED)):
    return "failed"
  if os.path.exists(os.path.join(workdir, TRAINER_SUMMARY)):
    return "done"
  if any(os.path.exists(os.path.join(workdir, f)) for f in (LOG, ATTEMPTS, "metrics.jsonl")):
    return "unfinished"
  return "pending"


def read_json(path: str) -> dict[str, Any] | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _write_json(path: str, obj: Mapping[str, Any]) -> None:
  # Write-then-rename so a marker is never seen half-written.
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)


def write_plan(sweep_dir: str, config_spec: str, members: Sequence[spec_lib.Member],
               common: Mapping[str, Any]) -> None:
  """SWEEP_DIR/sweep.json: every member of the sweep, so the report can list those not started yet."""
  os.makedirs(sweep_dir, exist_ok=True)
  _write_json(os.path.join(sweep_dir, SWEEP_JSON),
              {"config": config_spec, "common_overrides": dict(common),
               "members": [m.to_json() for m in members]})


def _tail(text: str, lines: int = ERROR_TAIL_LINES) -> str:
  return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def previous_wall_s(workdir: str) -> float:
  """Seconds spent in all earlier attempts of this member."""
  total = 0.0
  for attempt in read_jsonl(os.path.join(workdir, ATTEMPTS)):
    try:
      total += float(attempt["wall_s"])
    except (ValueError, KeyError, TypeError):
      continue
  return total


# Where scripts/train.py keeps a run's starting point (grpo_jax/train/loop.py): warmstart/ (the parameters after
# the warm start, never rotated out) and, in older workdirs, only the step-0 checkpoint.
TRAINER_STARTING_POINTS = (os.path.join("warmstart", "0"), os.path.join("checkpoints", "0"))
TRAINER_CHECKPOINTS = "checkpoints"
INIT_FROM_JSON = "init_from.json"
INIT_KEY = "warmstart.init_checkpoint"


def has_starting_point(donor_workdir: str) -> bool:
  """Whether the donor has written the state it started GRPO from (what `warmstart.init_checkpoint` reads)."""
  return any(os.path.exists(os.path.join(donor_workdir, p, "commit_success.txt")) for p in TRAINER_STARTING_POINTS)


def init_overrides(member: spec_lib.Member, sweep_dir: str, workdir: str, before: str) -> dict[str, Any]:
  """{warmstart.init_checkpoint: donor} when the member starts from its donor's warm start (shared warm start).

  The trainer then loads the donor's parameters, data position and step-0 evaluation instead of repeating the
  warm start (grpo_jax/train/loop.py). This is exact when the donor's warm start is the one the member would
  compute itself: the same seed, task, model, warm-start and evaluation settings (the warm start depends on
  nothing else). The decision is made at the first attempt and kept (init_from.json) for later ones; a member
  whose donor has no starting point yet runs its own warm start."""
  if not member.init_from:
    return {}
  record = read_json(os.path.join(workdir, INIT_FROM_JSON))
  if record is not None:
    return {INIT_KEY: record["donor"]}
  donor = os.path.abspath(os.path.join(sweep_dir, member.init_from))
  if before != "pending" or os.path.exists(os.path.join(workdir, TRAINER_CHECKPOINTS)) or not has_starting_point(donor):
    return {}
  _write_json(os.path.join(workdir, INIT_FROM_JSON), {"donor": donor, "step": 0})
  return {INIT_KEY: donor}


def run_member(member: spec_lib.Member, *, config_spec: str, sweep_dir: str, train_cmd: Sequence[str],
               common: Mapping[str, Any] | None = None, skip_failed: bool = False,
               env: Mapping[str, str] | None = None, echo=print) -> str:
  """Runs one member unless it is finished; returns its status afterwards ('done', 'failed', 'skipped-*')."""
  workdir = member_dir(sweep_dir, member)
  before = status(workdir)
  if before == "done":
    echo(f"[sweep] {member.name}: finished, skipping")
    return "skipped-done"
  if before == "failed" and skip_failed:
    echo(f"[sweep] {member.name}: failed before, skipping (--skip_failed)")
    return "skipped-failed"
  os.makedirs(workdir, exist_ok=True)
  init = init_overrides(member, sweep_dir, workdir, before)
  if member.init_from and before == "pending":
    echo(f"[sweep] {member.name}: " + (f"starts from {member.init_from}'s warm start (shared warm start)" if init
                                       else f"{member.init_from} has no starting point yet; running its own warm start"))
  argv = spec_lib.train_command(train_cmd, config_spec, workdir,
                                {**spec_lib.merge_overrides(common or {}, member), **init})
  _write_json(os.path.join(workdir, MEMBER_JSON), {**member.to_json(), "command": argv})
  if before == "failed":
    os.remove(os.path.join(workdir, FAILED))
  echo(f"[sweep] {member.name}: {'resuming' if before != 'pending' else 'starting'} "
       f"(log: {os.path.join(workdir, LOG)})")
  log_path = os.path.join(workdir, LOG)
  with open(log_path, "a") as log:
    log.write(f"\n===== sweep attempt at {time.strftime('%Y-%m-%d %H:%M:%S')}: {spec_lib.shell_join(argv)}\n")
    log.flush()
    attempt_offset = log.tell()
    start = time.time()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=None if env is None else dict(env))
    try:
      rc = proc.wait()
    except BaseException:
      # Interrupted (Ctrl-C, SIGTERM): stop the trainer and leave the member unfinished, so a re-run resumes it.
      proc.terminate()
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
      raise
  wall_s = time.time() - start
  with open(os.path.join(workdir, ATTEMPTS), "a") as f:
    f.write(json.dumps({"start": start, "wall_s": wall_s, "rc": rc}) + "\n")
  total_wall_s = previous_wall_s(workdir)
  if rc == 0:
    _write_json(os.path.join(workdir, DONE), {"rc": 0, "wall_s": total_wall_s, "finished": time.time()})
    echo(f"[sweep] {member.name}: done in {wall_s:.1f}s")
    return "done"
  with open(log_path) as f:
    f.seek(attempt_offset)
    error = _tail(f.read())
  _write_json(os.path.join(workdir, FAILED), {"rc": rc, "wall_s": total_wall_s, "error": error})
  echo(f"[sweep] {member.name}: FAILED with exit code {rc}; last lines:\n{_tail(error, 5)}")
  return "failed"


def run_sweep(members: Sequence[spec_lib.Member], **kwargs) -> dict[str, str]:
  """Runs the members one after another (a failure does not stop the others); returns name -> outcome."""
  return {m.name: run_member(m, **kwargs) for m in members}
