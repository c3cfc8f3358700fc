"""A sweep from Python: `run_sweep(config_spec, sweep_dir, backend="local" | "ray")`, what `grpo-sweep` runs.

    from grpo_jax.sweep import run_sweep
    outcomes = run_sweep("experiments/ablation_variants.py", "runs/av", backend="ray",
                         member_resources={"CPU": 1}, common={"num_steps": 50})

Both backends write the same files per member (grpo_jax/sweep/runner.py), so reports and resumes do not
care which one ran a sweep.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from grpo_jax import storage
from grpo_jax.persist.layout import sweep_file
from grpo_jax.sweep import progress, ray_backend, runner, spec
from grpo_jax.errors import UserError

BACKENDS = ("local", "ray")


def load_members(config_spec: str, *, only: str | None = None, common: Mapping[str, Any] | None = None,
                 check_keys: bool = True) -> list[spec.Member]:
  """The experiment file's members (`--only` regex applied), with `common` checked: no clash with a member's
  own overrides, and (with check_keys) every key a field of the experiment's config."""
  members = spec.select(spec.load_sweep(config_spec, check_keys=check_keys, common=common), only)
  for m in members:
    spec.merge_overrides(common or {}, m)  # clashes are errors before anything runs
  return members


def run_sweep(config_spec: str, sweep_dir: str, *, backend: str = "local", members: Sequence[spec.Member] | None = None,
              only: str | None = None, common: Mapping[str, Any] | None = None,
              train_cmd: Sequence[str] | None = None, skip_failed: bool = False, max_attempts: int = 3,
              max_preemptions: int = runner.MAX_PREEMPTIONS, member_resources: str | Mapping[str, Any] | None = None,
              ray_address: str | None = None,
              check_keys: bool = True, echo=print, ray_init_kwargs: Mapping[str, Any] | None = None) -> dict[str, str]:
  """Runs the sweep's members (all of `get_sweep()`, or `members`) on `backend`; returns name -> outcome
  ('done', 'failed', 'skipped-done', ...). Finished members are skipped, unfinished ones resume.

  Ray: `ray_address` picks the cluster (None: a local instance), `member_resources` what one member needs per
  host (None: the experiment file's `get_member_resources()`, else a default for the cluster)."""
  if backend not in BACKENDS:
    raise UserError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
  if max_attempts < 1:
    raise UserError(f"max_attempts must be >= 1, got {max_attempts}")
  if max_preemptions < 0:
    raise UserError(f"max_preemptions must be >= 0, got {max_preemptions}")
  common = dict(common or {})
  if members is None:
    members = load_members(config_spec, only=only, common=common, check_keys=check_keys)
  if backend == "ray":  # a missing extra or a bad resource request is reported before anything is written
    ray_backend.import_ray()
    resources = member_resources or getattr(spec.load_module(config_spec), "get_member_resources", lambda: None)()
    resources = resources and ray_backend.MemberResources.parse(resources)
  if only is None:  # a job-array task (only=...) must not overwrite the full plan with its one member
    runner.write_plan(sweep_dir, config_spec, members, common)
  elif not storage.exists(sweep_file(sweep_dir)):
    runner.write_plan(sweep_dir, config_spec, spec.load_sweep(config_spec), common)
  if backend == "ray":
    return ray_backend.run_members(
        members, config_spec=config_spec, sweep_dir=sweep_dir, common=common, skip_failed=skip_failed,
        train_cmd=train_cmd, max_attempts=max_attempts, max_preemptions=max_preemptions, address=ray_address,
        echo=echo, init_kwargs=ray_init_kwargs, resources=resources)
  started = time.time()
  live, shown = progress.LiveLine(echo), [0.0]
  every_s = storage.poll_s(sweep_dir)  # it reads each member's files

  def show_progress():
    if time.time() - shown[0] >= every_s:
      shown[0] = time.time()
      live.show(progress.read_members(sweep_dir, members))

  try:
    outcomes = runner.run_members(members, config_spec=config_spec, sweep_dir=sweep_dir,
                                  train_cmd=list(train_cmd or spec.default_train_cmd()), common=common,
                                  skip_failed=skip_failed, max_attempts=max_attempts,
                                  max_preemptions=max_preemptions, echo=echo, tick=show_progress)
  finally:
    live.end()
  echo(progress.summary_table(progress.read_members(sweep_dir, members, outcomes), time.time() - started))
  return outcomes
