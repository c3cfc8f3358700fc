"""A sweep directory on a store: member.json, attempts.jsonl, train.log (with each attempt's output), DONE /
FAILED and sweep.json are written there, a crashed member resumes, a member starts from its donor's warm start
there, and the progress reader sees it all."""
from __future__ import annotations

import json
import os
import sys

import pytest
from etils import epath

from grpo_jax import storage
from grpo_jax.commands import plot as plot_command
from grpo_jax.sweep import progress, report, runner, spec
from grpo_jax.persist.metrics import read_jsonl
from grpo_jax.persist.layout import RunFiles, sweep_file

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("scheme", ["s3", pytest.param("gs", marks=pytest.mark.faults)])  # gs: same code, 9 s
def test_a_sweep_on_a_store_records_its_members_and_resumes_a_crashed_one(scheme, request):
  store = request.getfixturevalue({"s3": "s3", "gs": "gcs"}[scheme])
  sweep_dir = store.url("sweep")
  members = spec.validate([{"name": "ok_seed0", "overrides": {"num_steps": 2}},
                           {"name": "crash_seed0", "overrides": {"num_steps": 3, "crash_at": 2}},
                           {"name": "shared_seed0", "overrides": {"num_steps": 1}, "init_from": "ok_seed0"}])
  runner.write_plan(sweep_dir, "exp.py", members, {})
  kwargs = dict(config_spec="exp.py", sweep_dir=sweep_dir, echo=lambda *_: None,
                train_cmd=[sys.executable, os.path.join(HERE, "store_fake_train.py")],
                env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(HERE)),
                                                                  os.environ.get("PYTHONPATH", "")])))
  assert runner.run_members(members, **kwargs) == {"ok_seed0": "done", "crash_seed0": "failed",
                                                   "shared_seed0": "done"}
  shared, donor = storage.join(sweep_dir, "shared_seed0"), storage.join(sweep_dir, "ok_seed0")
  assert f"--config.warmstart.init_checkpoint={donor}" in runner.read_json(RunFiles(shared).member)[
      "command"]
  assert f"starting from {donor}'s warm start" in storage.read_text(RunFiles(shared).train_log)
  crashed = storage.join(sweep_dir, "crash_seed0")
  assert "RuntimeError: simulated crash" in runner.read_json(RunFiles(crashed).failed)["error"]
  assert runner.run_members(members, **kwargs) == {"ok_seed0": "skipped-done", "crash_seed0": "done",
                                                   "shared_seed0": "skipped-done"}

  assert [m["name"] for m in json.loads(storage.read_text(sweep_file(sweep_dir)))["members"]] \
      == ["ok_seed0", "crash_seed0", "shared_seed0"]
  assert not storage.exists(RunFiles(crashed).failed)
  assert runner.read_json(RunFiles(crashed).done)["rc"] == 0
  assert [r.get("rc") for r in read_jsonl(RunFiles(crashed).attempts)] == [None, 1, None, 0]
  log = storage.read_text(RunFiles(crashed).train_log)
  assert log.count("===== sweep attempt") == 2
  assert "starting at step 0" in log and "starting at step 2" in log  # each attempt's own output, in order
  assert log.index("starting at step 0") < log.index("simulated crash") < log.index("starting at step 2")
  assert [r["step"] for r in read_jsonl(storage.join(crashed, "metrics.jsonl"))] == [0, 1, 2, 3]
  member = runner.read_json(RunFiles(crashed).member)
  assert member["command"][member["command"].index("--workdir") + 1] == crashed
  seen = progress.read_member(sweep_dir, "crash_seed0")
  assert (seen.state, seen.step, seen.attempts) == ("done", 3, 2)
  # grpo-report and grpo-plot read (and write) there too.
  paths = report.write_report(sweep_dir, smooth=1)
  assert paths["summary.md"] == storage.join(sweep_dir, "report", "summary.md")
  assert "crash" in storage.read_text(paths["summary.md"])
  assert storage.exists(storage.join(sweep_dir, "report", "curves.png"))
  plot_command.run([crashed])
  assert storage.exists(storage.join(crashed, "curves.png"))
  epath.Path(sweep_dir).rmtree(missing_ok=True)
