"""Runs a sweep member's trainer in its own workdir and records how each attempt ended; the local backend runs
the members one after another (grpo_jax/sweep/ray_backend.py runs the same attempts as Ray tasks).

Files in a member's workdir (SWEEP_DIR/<name>/) besides what the trainer writes:
  member.json     the member (name, group, overrides) and the exact trainer command,
  train.log       the trainer's stdout and stderr, appended to by every attempt,
  attempts.jsonl  two lines per attempt: when it started and on which node; then its wall seconds, exit code
                  (negative: the signal that stopped it when the sweep was interrupted) and `outcome`: done,
                  failed, preempted (exit code 75, EXIT_PREEMPTED: the trainer saved its last step on SIGTERM or
                  SIGINT; or, written by the Ray driver, its node or worker was lost, rc null) or stopped (the
                  sweep stopped it: Ctrl-C, SIGTERM to the driver, a failed peer process),
  DONE            written after the trainer exited with code 0: the member is finished and is skipped from then on,
  FAILED          written after a non-zero exit (but 75): exit code and the tail of that attempt's log. A failed
                  member is re-run by the next `grpo-sweep` (the trainer resumes from its latest checkpoint)
                  unless --skip_failed is given; the new attempt removes FAILED when it starts. A failure other
                  than a user error (exit code 2, grpo_jax/errors.py) is retried at once up to --max_attempts times.
A preempted attempt writes no marker and is retried at once without counting against --max_attempts, up to
--max_preemptions (MAX_PREEMPTIONS) times per member and sweep run, so a member on machines that keep going away
cannot loop forever; past that it is marked FAILED.
A member with neither marker is unfinished (never started, still running, or killed) and is (re)run.
The trainer's own completion marker, `summary.json` (written by grpo-train after its last step), also
counts as finished, so runs launched with the bare trainer commands (`--print_format=train`) are reported too.

A sweep directory may be on an object store (gs://, s3://; grpo_jax/storage.py): its files are then written
whole (a store has no append or rename), and an attempt's trainer output goes to a local copy of train.log that
is copied onto it every LOG_UPLOAD_S seconds and when the attempt ends (storage.AppendFile).
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from grpo_jax import storage
from grpo_jax.sweep import spec as spec_lib
from grpo_jax.persist.layout import TRAIN_LOG, RunFiles, sweep_file
from grpo_jax.persist.workdir_lock import wait_until_free
from grpo_jax.errors import EXIT_PREEMPTED, EXIT_USER_ERROR
from grpo_jax.persist.metrics import read_jsonl

ERROR_TAIL_LINES = 30
# Preemptions retried per member in one sweep run: spot VMs may be reclaimed several times over a long member,
# each retry resumes from the last checkpoint; a member on a cluster that keeps dying stops after this many.
MAX_PREEMPTIONS = 10
LOG_UPLOAD_S = 30.0  # a store sweep's train.log lags the trainer's output by at most this


def member_dir(sweep_dir: str, member: spec_lib.Member) -> str:
  return storage.join(sweep_dir, member.name)


def status(workdir: str) -> str:
  """'done', 'failed', 'unfinished' (has a log or metrics but no marker) or 'pending' (never started)."""
  files = RunFiles(workdir)
  if storage.exists(files.done):
    return "done"
  if storage.exists(files.failed):
    return "failed"
  if storage.exists(files.summary):
    return "done"
  return "unfinished" if any(storage.exists(p) for p in (files.train_log, files.attempts, files.metrics)) else "pending"


def read_json(path: str) -> dict[str, Any] | None:
  try:
    return json.loads(storage.read_text(path))
  except (OSError, ValueError):
    return None


def _write_json(path: str, obj: Mapping[str, Any]) -> None:
  """Written whole (atomic): a marker is never seen half-written."""
  storage.write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", atomic=True)


def write_plan(sweep_dir: str, config_spec: str, members: Sequence[spec_lib.Member],
               common: Mapping[str, Any]) -> None:
  """SWEEP_DIR/sweep.json: every member of the sweep, so the report can list those not started yet."""
  _write_json(sweep_file(sweep_dir),
              {"config": config_spec, "common_overrides": dict(common),
               "members": [m.to_json() for m in members]})


def _tail(text: str, lines: int = ERROR_TAIL_LINES) -> str:
  return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def previous_wall_s(workdir: str) -> float:
  """Seconds spent in all earlier attempts of this member."""
  total = 0.0
  for row in read_jsonl(RunFiles(workdir).attempts):
    with contextlib.suppress(ValueError, KeyError, TypeError):  # a start line, or a damaged one
      total += float(row["wall_s"])
  return total


def member_wall_s(workdir: str) -> float:
  """Seconds the member has taken: the sum over its attempts, or the trainer's own total where that is larger (an
  attempt killed without a trace, e.g. by a machine's end, records no end time; the trainer's `wall_s` in
  summary.json still counts it up to the checkpoint the next attempt resumed from). 0.0 when neither exists."""
  trainer_s = 0.0
  with contextlib.suppress(TypeError, ValueError):
    trainer_s = float((read_json(RunFiles(workdir).summary) or {}).get("wall_s") or 0.0)
  return max(previous_wall_s(workdir), trainer_s)


INIT_FROM_JSON = "init_from.json"
INIT_KEY = "warmstart.init_checkpoint"


def attempt_running(workdir: str) -> bool:
  """Whether the member's last attempt started and has not ended (or its process was lost without a trace)."""
  rows = read_jsonl(RunFiles(workdir).attempts)
  ended = {r.get("start") for r in rows if "rc" in r}
  return any("rc" not in r and r.get("start") not in ended for r in rows[-2:])


def wait_for_donor(member: spec_lib.Member, sweep_dir: str, *, timeout_s: float = 3600.0, grace_s: float = 30.0,
                   poll_s: float = 1.0) -> None:
  """When members run at once (the Ray backend), a member that would share its donor's warm start waits for it:
  while the donor runs (or, for `grace_s`, has not started yet) and has not written its starting point. A donor
  that is queued behind or failed is not waited for; the member then runs its own warm start."""
  if not member.init_from or status(member_dir(sweep_dir, member)) != "pending":
    return
  donor = storage.join(sweep_dir, member.init_from)
  start = time.time()
  while RunFiles(donor).starting_point() is None and time.time() - start < timeout_s:
    if not (attempt_running(donor) or status(donor) == "pending" and time.time() - start < grace_s):
      return
    time.sleep(poll_s)


def init_overrides(member: spec_lib.Member, sweep_dir: str, workdir: str, before: str) -> dict[str, Any]:
  """{warmstart.init_checkpoint: donor} when the member starts from its donor's warm start (shared warm start).

  The trainer then loads the donor's parameters, data position and step-0 evaluation instead of repeating the
  warm start (grpo_jax/train/loop.py). This is exact when the donor's warm start is the one the member would
  compute itself: the same seed, task, model, warm-start and evaluation settings (the warm start depends on
  nothing else). The decision is made at the first attempt and kept (init_from.json) for later ones; a member
  whose donor has no starting point yet runs its own warm start."""
  if not member.init_from:
    return {}
  record = read_json(storage.join(workdir, INIT_FROM_JSON))
  if record is not None:
    return {INIT_KEY: record["donor"]}
  donor = storage.absolute(storage.join(sweep_dir, member.init_from))
  if before != "pending" or storage.isdir(RunFiles(workdir).checkpoints) or RunFiles(donor).starting_point() is None:
    return {}
  _write_json(storage.join(workdir, INIT_FROM_JSON), {"donor": donor, "step": 0})
  return {INIT_KEY: donor}


def prepare(member: spec_lib.Member, *, config_spec: str, sweep_dir: str, train_cmd: Sequence[str],
            common: Mapping[str, Any] | None = None, skip_failed: bool = False,
            echo=print) -> tuple[str, list[str]] | str:
  """(workdir, trainer argv) for a member to run, with member.json written; or 'skipped-done'/'skipped-failed'."""
  workdir = member_dir(sweep_dir, member)
  before = status(workdir)
  if before == "done":
    echo(f"[sweep] {member.name}: finished, skipping")
    return "skipped-done"
  if before == "failed" and skip_failed:
    echo(f"[sweep] {member.name}: failed before, skipping (--skip_failed)")
    return "skipped-failed"
  storage.makedirs(workdir)
  init = init_overrides(member, sweep_dir, workdir, before)
  if member.init_from and before == "pending":
    echo(f"[sweep] {member.name}: " + (f"starts from {member.init_from}'s warm start (shared warm start)" if init
                                       else f"{member.init_from} has no starting point yet; running its own warm start"))
  argv = spec_lib.train_command(train_cmd, config_spec, workdir,
                                {**spec_lib.merge_overrides(common or {}, member), **init})
  _write_json(RunFiles(workdir).member, {**member.to_json(), "command": argv})
  echo(f"[sweep] {member.name}: {'resuming' if before != 'pending' else 'starting'} "
       f"(log: {RunFiles(workdir).train_log})")
  return workdir, argv


def _die_with_parent() -> None:
  """Runs in the trainer's process before exec: the kernel sends it SIGTERM when its parent dies, however the
  parent dies (a SIGKILLed sweep driver, a Ray worker killed by `ray.cancel(force=True)` or a lost node)."""
  import ctypes
  import signal
  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1 (Linux)


def attempt(workdir: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            log_name: str = TRAIN_LOG, node: str = "", abort: Callable[[], bool] | None = None,
            tick: Callable[[], None] | None = None) -> tuple[int, int]:
  """Runs the trainer once, appending its output to WORKDIR/LOG_NAME; returns (exit code, log offset of this
  attempt). attempts.jsonl gets a line when the attempt starts and one with its exit code when it ends (a lost
  node leaves only the first). `abort()`, polled every second, stops the trainer early (rc -SIGTERM); `tick()`,
  called every second too, shows progress."""
  storage.remove(RunFiles(workdir).failed)
  wait_until_free(workdir)  # the trainer of an earlier attempt may still be saving and exiting
  with storage.AppendFile(storage.join(workdir, log_name)) as log:
    log.write(f"\n===== sweep attempt at {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(argv)}\n")
    log.flush()
    offset = log.tell()
    start = time.time()
    if log_name == TRAIN_LOG:
      append_jsonl(RunFiles(workdir).attempts, {"start": start, "node": node or os.uname().nodename})
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                            env=None if env is None else dict(env),
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    stopped = aborted = False
    try:
      while True:
        try:
          rc = proc.wait(timeout=1.0)
          break
        except subprocess.TimeoutExpired:
          log.flush(every_s=LOG_UPLOAD_S)
          if tick:
            tick()
          if abort and abort():
            stopped = aborted = True
            _stop(proc)
            rc = proc.returncode
            break
    except BaseException:
      # Interrupted (Ctrl-C, SIGTERM, a cancelled Ray task): stop the trainer (SIGTERM: the trainer saves its
      # last step and exits with EXIT_PREEMPTED) and leave the member unfinished, so a re-run resumes it.
      stopped = True
      _stop(proc)
      raise
    finally:  # also when interrupted: the attempt's time counts towards the member's
      if log_name == TRAIN_LOG:
        append_jsonl(RunFiles(workdir).attempts,
                     {"start": start, "wall_s": time.time() - start, "rc": proc.returncode,
                      "outcome": attempt_outcome(proc.returncode, stopped, aborted)})
  return rc, offset


def attempt_outcome(rc: int | None, stopped: bool = False, aborted: bool = False) -> str:
  """An attempt's end in attempts.jsonl. A trainer stopped by the sweep's own SIGTERM (the driver interrupted,
  e.g. by a cluster's preemption) that saved its step and exited with EXIT_PREEMPTED counts as preempted; one
  stopped because a peer process of its member failed does not."""
  if rc == 0:
    return "done"
  if rc == EXIT_PREEMPTED and not aborted:
    return "preempted"
  return "stopped" if stopped else "failed"


# SIGTERM, then SIGKILL after this long. The trainer saves and exits within its own
# checkpoint.preemption_deadline_s (25 s by default, up to AWS's 120 s notice), ending itself at that deadline,
# so the kill is only for a trainer that ignores SIGTERM (an old version) and must not cut a save short.
STOP_GRACE_S = 150.0


def _stop(proc: subprocess.Popen) -> None:
  proc.terminate()
  try:
    proc.wait(timeout=STOP_GRACE_S)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def append_jsonl(path: str, row: Mapping[str, Any]) -> None:
  with storage.AppendFile(path) as f:  # on a store: the object rewritten with the row added
    f.write(json.dumps(row) + "\n")


def record(member: spec_lib.Member, workdir: str, rc: int, offset: int, echo=print) -> str:
  """Writes DONE (rc 0) or FAILED (exit code and the tail of the attempt's log); returns 'done' or 'failed', or
  'preempted' (EXIT_PREEMPTED: no marker, the member stays unfinished and resumes from its last step)."""
  total_wall_s = member_wall_s(workdir)
  if rc == 0:
    _write_json(RunFiles(workdir).done, {"rc": 0, "wall_s": total_wall_s, "finished": time.time()})
    echo(f"[sweep] {member.name}: done ({total_wall_s:.1f}s in all)")
    return "done"
  if rc == EXIT_PREEMPTED:
    echo(f"[sweep] {member.name}: preempted (exit code {rc}): its trainer saved its last step")
    return "preempted"
  error = _tail(storage.read_bytes(RunFiles(workdir).train_log)[offset:].decode(errors="replace"))
  mark_failed(workdir, rc, error)
  echo(f"[sweep] {member.name}: FAILED with exit code {rc}; last lines:\n{_tail(error, 5)}")
  return "failed"


def mark_failed(workdir: str, rc: int | None, error: str) -> None:
  """FAILED: the exit code (None: the process was lost with its node), wall time so far and the error."""
  _write_json(RunFiles(workdir).failed, {"rc": rc, "wall_s": member_wall_s(workdir), "error": error})


def run_member(member: spec_lib.Member, *, config_spec: str, sweep_dir: str, train_cmd: Sequence[str],
               common: Mapping[str, Any] | None = None, skip_failed: bool = False, max_attempts: int = 1,
               max_preemptions: int = MAX_PREEMPTIONS, env: Mapping[str, str] | None = None, echo=print,
               tick: Callable[[], None] | None = None) -> str:
  """Runs one member unless it is finished, again as `retry` says; returns its status afterwards ('done',
  'failed', 'skipped-*')."""
  prepared = prepare(member, config_spec=config_spec, sweep_dir=sweep_dir, train_cmd=train_cmd, common=common,
                     skip_failed=skip_failed, echo=echo)
  if isinstance(prepared, str):
    return prepared
  workdir, argv = prepared
  ends: dict[str, int] = {}
  while True:
    rc, offset = attempt(workdir, argv, env=env, tick=tick)
    outcome = retry(member, workdir, record(member, workdir, rc, offset, echo), rc, ends, max_attempts,
                    max_preemptions, echo)
    if outcome:
      return outcome


def retry(member: spec_lib.Member, workdir: str, outcome: str, rc: int | None, ends: dict[str, int],
          max_attempts: int, max_preemptions: int, echo=print) -> str | None:
  """After an attempt that ended as `outcome` (counted in `ends`, the member's outcomes so far): None when the
  member is to run again, resuming from its last checkpoint, else its outcome. A preempted member runs again up to
  `max_preemptions` times, then is marked FAILED; a failed one while fewer than `max_attempts` attempts failed,
  unless it exited 0 or with a user error (exit code 2: a bad key or value, a workdir that holds another run),
  which a new attempt would repeat (a crash, a kill or a lost task, rc None, may pass)."""
  ends[outcome] = n = ends.get(outcome, 0) + 1
  if outcome == "preempted":
    if n <= max_preemptions:
      echo(f"[sweep] {member.name}: preemption {n} (at most {max_preemptions}), resuming from its last checkpoint")
      return None
    error = (f"preempted {n} times in this sweep run, more than --max_preemptions={max_preemptions}: the "
             "machines keep going away; start the sweep again to resume it, or raise --max_preemptions")
    mark_failed(workdir, EXIT_PREEMPTED, error)
    echo(f"[sweep] {member.name}: FAILED, {error}")
    return "failed"
  if outcome == "failed" and rc not in (0, EXIT_USER_ERROR) and n < max_attempts:
    echo(f"[sweep] {member.name}: attempt {n + 1} of {max_attempts}, resuming from its last checkpoint")
    return None
  return outcome


def run_members(members: Sequence[spec_lib.Member], **kwargs) -> dict[str, str]:
  """Runs the members one after another (a failure does not stop the others); returns name -> outcome."""
  return {m.name: run_member(m, **kwargs) for m in members}
