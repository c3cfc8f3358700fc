import json
import os
import subprocess
import sys

import pytest

from grpo_jax.sweep import runner, spec
from grpo_jax.persist.layout import RunFiles
from tests.sweep.conftest import REPO


def _invocations(workdir):
  with open(os.path.join(workdir, "invocations.jsonl")) as f:
    return [json.loads(line) for line in f]


def _steps(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["step"] for line in f]


def test_run_marks_done_and_failed_and_skips_finished(tmp_path, fake_train_cmd, experiment_file):
  sweep_dir = str(tmp_path / "sweep")
  members = spec.load_sweep(experiment_file)
  kwargs = dict(config_spec=experiment_file, sweep_dir=sweep_dir, train_cmd=fake_train_cmd,
                common={"num_steps": 3}, echo=lambda *_: None)
  outcomes = runner.run_members(members, **kwargs)
  assert outcomes == {"grpo_seed0": "done", "grpo_seed1": "done", "rloo_seed0": "done", "rloo_seed1": "done",
                      "broken": "failed"}
  done_dir = os.path.join(sweep_dir, "rloo_seed1")
  assert _steps(done_dir) == [0, 1, 2, 3]
  (argv,) = _invocations(done_dir)
  assert argv == ["--config", experiment_file, "--workdir", done_dir, "--config.num_steps=3",
                  "--config.algo.advantage=rloo", "--config.seed=1"]
  assert runner.read_json(os.path.join(done_dir, "DONE"))["rc"] == 0
  failed = runner.read_json(os.path.join(sweep_dir, "broken", "FAILED"))
  assert failed["rc"] == 3 and "ValueError: fake failure" in failed["error"]
  assert runner.status(os.path.join(sweep_dir, "broken")) == "failed"

  # Started again: finished members are not run again, the failed one is retried (and fails again).
  again = runner.run_members(members, **kwargs)
  assert again["grpo_seed0"] == "skipped-done" and again["broken"] == "failed"
  assert len(_invocations(done_dir)) == 1
  assert len(_invocations(os.path.join(sweep_dir, "broken"))) == 2
  with open(os.path.join(sweep_dir, "broken", "attempts.jsonl")) as f:
    assert [json.loads(line).get("rc") for line in f] == [None, 3, None, 3]  # start and end of each attempt
  assert runner.run_members(members[-1:], skip_failed=True, **kwargs) == {"broken": "skipped-failed"}


def test_crashed_member_resumes_and_then_counts_as_done(tmp_path, fake_train_cmd):
  sweep_dir = str(tmp_path / "sweep")
  (member,) = spec.validate([{"name": "c_seed0", "overrides": {"crash_at": 2, "num_steps": 5}}])
  kwargs = dict(config_spec="exp.py", sweep_dir=sweep_dir, train_cmd=fake_train_cmd, echo=lambda *_: None)
  workdir = os.path.join(sweep_dir, "c_seed0")
  assert runner.status(workdir) == "pending"
  assert runner.run_member(member, **kwargs) == "failed"
  assert "simulated crash" in runner.read_json(os.path.join(workdir, "FAILED"))["error"]
  assert runner.run_member(member, **kwargs) == "done"
  assert not os.path.exists(os.path.join(workdir, "FAILED"))
  assert _steps(workdir) == [0, 1, 2, 3, 4, 5]  # the second attempt resumed at the "checkpoint"
  done = runner.read_json(os.path.join(workdir, "DONE"))
  assert done["wall_s"] == runner.previous_wall_s(workdir) > 0
  assert runner.run_member(member, **kwargs) == "skipped-done"
  assert len(_invocations(workdir)) == 2
  with open(os.path.join(workdir, "train.log")) as f:
    assert f.read().count("===== sweep attempt") == 2


def _cli(*args):
  return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "sweep.py"), *args],
                        capture_output=True, text=True, cwd=REPO, timeout=60)


def test_member_wall_s_counts_an_attempt_killed_without_a_trace(tmp_path):
  workdir = tmp_path / "m"
  workdir.mkdir()
  assert runner.member_wall_s(str(workdir)) == 0.0
  # Attempt 1 was killed with its machine (a start, no end); attempt 2 resumed and ran 5 s.
  (workdir / "attempts.jsonl").write_text('{"start": 1, "node": "n"}\n{"start": 90, "node": "n"}\n'
                                          '{"start": 90, "wall_s": 5.0, "rc": 0}\n')
  assert runner.member_wall_s(str(workdir)) == 5.0
  # The trainer's total counts attempt 1 up to the checkpoint attempt 2 resumed from.
  (workdir / "summary.json").write_text('{"wall_s": 50.0}')
  assert runner.member_wall_s(str(workdir)) == 50.0
  (workdir / "summary.json").write_text('{"wall_s": 3.0}')  # never below what the runner measured
  assert runner.member_wall_s(str(workdir)) == 5.0
  (workdir / "summary.json").write_text('{"wall_s": "?"}')
  assert runner.member_wall_s(str(workdir)) == 5.0


def test_cli_prints_one_command_per_member_and_each_runs_one_member(tmp_path, fake_train_cmd, experiment_file):
  sweep_dir = str(tmp_path / "sw")
  train_cmd = " ".join(fake_train_cmd)
  bare = _cli("--config", experiment_file, "--sweep_dir", sweep_dir, "--print_commands", "--print_format=train",
              "--only", "seed0", "--set", "num_steps=2", "--train_cmd", train_cmd)
  assert bare.returncode == 0, bare.stderr
  lines = bare.stdout.strip().splitlines()
  assert len(lines) == 2
  assert lines[0].endswith(f"--workdir {sweep_dir}/grpo_seed0 --config.num_steps=2 "
                           "--config.algo.advantage=grpo --config.seed=0")
  assert not os.path.exists(sweep_dir)  # printing commands runs nothing

  printed = _cli("--config", experiment_file, "--sweep_dir", sweep_dir, "--print_commands",
                 "--set", "num_steps=2", "--train_cmd", train_cmd)
  lines = printed.stdout.strip().splitlines()
  assert len(lines) == 5 and all("--only" in line for line in lines)
  run = subprocess.run(lines[2], shell=True, capture_output=True, text=True, cwd=REPO, timeout=60)
  assert run.returncode == 0, run.stderr
  assert sorted(os.listdir(sweep_dir)) == ["rloo_seed0", "sweep.json"]
  assert _steps(os.path.join(sweep_dir, "rloo_seed0")) == [0, 1, 2]
  assert len(runner.read_json(os.path.join(sweep_dir, "sweep.json"))["members"]) == 5

  full = _cli("--config", experiment_file, "--sweep_dir", sweep_dir, "--set", "num_steps=2", "--train_cmd",
              train_cmd)
  assert full.returncode == 1  # "broken" failed
  assert "rloo_seed0: finished, skipping" in full.stdout
  assert "3 done, 1 failed, 1 skipped-done" in full.stdout
  status = _cli("--config", experiment_file, "--sweep_dir", sweep_dir, "--status")
  assert status.stdout.split() == ["done", "grpo_seed0", "done", "grpo_seed1", "done", "rloo_seed0",
                                   "done", "rloo_seed1", "failed", "broken"]


def _starts(workdir):
  with open(os.path.join(workdir, "starts.txt")) as f:
    return f.read().splitlines()


def test_members_start_from_their_donors_warm_start(tmp_path, fake_train_cmd):
  sweep_dir = str(tmp_path / "sweep")
  members = spec.validate(spec.order_by_seed(spec.share_warm_start(
      spec.grid(spec.axis("adv", ["a", "b"]), seeds=[0, 1], common={"num_steps": 2}), donor_group="a")))
  assert [(m.name, m.init_from) for m in members] == [("a_seed0", None), ("b_seed0", "a_seed0"),
                                                      ("a_seed1", None), ("b_seed1", "a_seed1")]
  kwargs = dict(config_spec="exp.py", sweep_dir=sweep_dir, train_cmd=fake_train_cmd, echo=lambda *_: None)
  # Without its donor having run, a member falls back to its own warm start.
  assert runner.run_member(members[3], **kwargs) == "done"
  assert _starts(os.path.join(sweep_dir, "b_seed1")) == ["warm start"]
  assert runner.run_members(members, **kwargs)["b_seed0"] == "done"
  donor, member = os.path.join(sweep_dir, "a_seed0"), os.path.join(sweep_dir, "b_seed0")
  assert _starts(donor) == ["warm start"] and _starts(member) == [f"from {os.path.abspath(donor)}"]
  command = runner.read_json(os.path.join(member, "member.json"))["command"]
  assert f"--config.warmstart.init_checkpoint={os.path.abspath(donor)}" in command
  with open(os.path.join(member, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert rows[0] == {"step": 0, "eval/accuracy": 0.2} and [r["step"] for r in rows] == [0, 1, 2]
  assert runner.read_json(os.path.join(member, "init_from.json"))["donor"] == os.path.abspath(donor)
  with open(os.path.join(donor, "warmstart.jsonl")) as a, open(os.path.join(member, "warmstart.jsonl")) as b:
    assert a.read() == b.read()


def test_cli_rejects_an_unknown_key_before_running_anything(tmp_path, experiment_file):
  result = _cli("--config", experiment_file, "--sweep_dir", str(tmp_path / "s"), "--set", "num_step=2")
  assert result.returncode == 2 and not os.path.exists(tmp_path / "s")
  assert result.stderr.strip() == "grpo-sweep: error: --set: override 'num_step': the config has no field 'num_step'"


@pytest.mark.parametrize("handles_sigterm", [False, True])
def test_cli_stopped_by_sigterm_prints_one_line_and_the_member_resumes(tmp_path, fake_train_cmd, handles_sigterm):
  """SIGTERM (a cluster's time limit, a preemption) is forwarded to the member's trainer: exit 130 with one line,
  no traceback; the attempt ends preempted if the trainer saved its step and exited with EXIT_PREEMPTED (75), else
  stopped; the same command then resumes the member from its checkpoint and finishes it."""
  import signal
  import textwrap
  import time
  exp = tmp_path / "exp.py"
  exp.write_text(textwrap.dedent(f"""
      def get_config(preset=None):
        return {{"seed": 0, "num_steps": 4, "sleep": 0.0, "handles_sigterm": False}}

      def get_sweep():
        return [{{"name": "slow", "overrides": {{"sleep": 1.0, "handles_sigterm": {handles_sigterm}}}}}]
      """))
  sweep_dir = tmp_path / "sw"
  args = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--config", str(exp), "--sweep_dir",
          str(sweep_dir), "--train_cmd", " ".join(fake_train_cmd)]
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = sweep_dir / "slow" / "metrics.jsonl"
  deadline = time.time() + 60
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130 and "Traceback" not in err, err
  assert err.strip().splitlines()[-1].startswith("[sweep] interrupted (signal 15): the running member stopped")
  assert runner.status(str(sweep_dir / "slow")) == "unfinished"
  (ended,) = [r for r in runner.read_jsonl(RunFiles(str(sweep_dir / "slow")).attempts) if "rc" in r]
  assert ended["wall_s"] > 0   # the stopped attempt's time is counted
  assert (ended["rc"], ended["outcome"]) == ((75, "preempted") if handles_sigterm else (-signal.SIGTERM, "stopped"))
  again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert again.returncode == 0 and runner.status(str(sweep_dir / "slow")) == "done", again.stderr
  with open(sweep_dir / "slow" / "starts.txt") as f:
    assert f.read().split("\n")[:2] == ["warm start", "from checkpoint 0"]


def _ends(workdir):
  return [(r["rc"], r["outcome"]) for r in runner.read_jsonl(RunFiles(os.path.join(workdir)).attempts) if "rc" in r]


def test_a_preempted_attempt_is_retried_apart_from_max_attempts_and_capped(tmp_path, fake_train_cmd):
  """Exit code 75 (EXIT_PREEMPTED) is recorded as preempted, writes no FAILED and is retried even with
  max_attempts=1; a member preempted more than max_preemptions times is marked FAILED, saying why."""
  from grpo_jax.sweep import progress
  sweep_dir = str(tmp_path / "sweep")
  members = spec.validate([{"name": "once", "overrides": {"num_steps": 4, "preempt_at": 2}},
                           {"name": "always", "overrides": {"always_preempted": True}}])
  outcomes = runner.run_members(members, config_spec="exp.py", sweep_dir=sweep_dir, train_cmd=fake_train_cmd,
                              max_attempts=1, max_preemptions=2, echo=lambda *_: None)
  assert outcomes == {"once": "done", "always": "failed"}
  once, always = (os.path.join(sweep_dir, n) for n in ("once", "always"))
  assert _ends(once) == [(75, "preempted"), (0, "done")] and _steps(once) == [0, 1, 2, 3, 4]
  assert _ends(always) == [(75, "preempted")] * 3
  failed = runner.read_json(os.path.join(always, "FAILED"))
  assert failed["rc"] == 75 and "more than --max_preemptions=2" in failed["error"]
  states = [progress.read_member(sweep_dir, n, outcomes[n]) for n in ("once", "always")]
  assert [(m.attempts, m.preempted) for m in states] == [(2, 1), (3, 3)]
  table = progress.summary_table(states, 1.0).splitlines()
  assert table[0].split() == ["member", "state", "attempts", "preempted", "wall"]
  assert table[1].split()[:4] == ["once", "done", "2", "1"] and table[2].split()[:4] == ["always", "failed", "3", "3"]
  assert table[-1].endswith("1 failed, 4 attempts preempted (retried apart from --max_attempts)")
  assert ", 1 failed, 4 preempted" in progress.status_line(states)
  # A crash still counts: with max_attempts=1 it is not retried.
  (crash,) = spec.validate([{"name": "crash", "overrides": {"crash_at": 2}}])
  assert runner.run_member(crash, config_spec="exp.py", sweep_dir=sweep_dir, train_cmd=fake_train_cmd,
                           echo=lambda *_: None) == "failed"
  assert _ends(os.path.join(sweep_dir, "crash")) == [(1, "failed")]


def test_the_local_backend_shows_a_status_line_while_members_run(tmp_path, fake_train_cmd, experiment_file):
  """The local backend's live line (as the Ray backend's): who runs, at which step, how many are done."""
  from grpo_jax.sweep import run_sweep
  lines = []
  members = [m for m in spec.load_sweep(experiment_file) if m.name in ("grpo_seed0", "grpo_seed1")]
  outcomes = run_sweep(experiment_file, str(tmp_path / "sweep"), backend="local", members=members,
                       train_cmd=fake_train_cmd, common={"num_steps": 3, "sleep": 0.8}, echo=lines.append)
  assert outcomes == {"grpo_seed0": "done", "grpo_seed1": "done"}
  status = [line for line in lines if line.startswith("[sweep] ") and " queued, " in line]
  assert status and status[0].startswith("[sweep] 1 queued, 1 running (grpo_seed0 step ")
  assert any(line.startswith("[sweep] 0 queued, 1 running (grpo_seed1 step ") and ", 1 done, 0 failed" in line
             for line in status)
