"""End-to-end runs of the tiny preset: what a run writes, compilation counts, exact resume after a kill (also
on a tiny random Gemma 3 checkpoint: sliding-window and global layers), fallback past a corrupt checkpoint, and
the plot script."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil

import pytest

from grpo_jax import config as config_lib
from grpo_jax import storage
from grpo_jax.commands import evaluate as evaluate_command
from grpo_jax.commands import plot as plot_command
from grpo_jax.rewards import register_reward
from grpo_jax.settings import Settings
from grpo_jax.train import build, checks, loop
from grpo_jax.persist import checkpoint as checkpoint_lib
from grpo_jax.train import producer as producer_lib
from grpo_jax.train import run as run_lib
from grpo_jax.train.inputs import RunInputs
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.metrics import read_jsonl
from grpo_jax.train.timing import TimeSplit
from grpo_jax.persist.workdir_lock import WorkdirLock
from tests.storage.conftest import gcs, gcs_server  # noqa: F401  (fixtures: a donor workdir on gs://)
from tests.train.conftest import load_experiment

TIMING = {"step_time", "tokens_per_s"}  # and every timing/* key


def _timing(name: str) -> bool:
  return name in TIMING or name.startswith("timing/")
NUM_STEPS = 6


def _config(hf_path: str = ""):
  c = load_experiment("default")("test")
  c.model.hf_path = hf_path  # "": the preset's fresh Llama-style model with character tokens
  c.num_steps = NUM_STEPS
  c.checkpoint.every = 3
  c.checkpoint.keep = 2
  c.eval.every = 3
  c.warmstart.max_steps = 1
  # Every path of the update: a reference model (beta > 0, reset every 2 steps), two passes over two
  # mini-batches of two micro-batches each, and the sampled evaluation (avg@2, pass@2, maj@2).
  c.grpo.beta = 0.04
  c.grpo.ref_reset_every = 2
  c.grpo.num_iterations = 2
  c.grpo.mini_batch_size = 8
  c.grpo.micro_batch_size = 4
  c.eval.samples, c.eval.pass_k, c.eval.maj_k = 2, (2,), (2,)
  # DAPO dynamic sampling: a step samples a varying number of prompt blocks, which resume must reproduce.
  c.grpo.dynamic_sampling = True
  c.grpo.dynamic_sampling_max_rounds = 3
  return c


def _metrics(workdir):
  return [{k: v for k, v in r.items() if not _timing(k)} for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def _final_meta(workdir):
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
  with open(os.path.join(workdir, "checkpoints", str(steps[-1]), "meta", "metadata")) as f:
    return steps[-1], json.load(f)


def _final_checksum(workdir):
  step, meta = _final_meta(workdir)
  return step, meta["state_fingerprint"], meta["data_position"]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, compile_cache):
  """An uninterrupted run, counting how often each array program is traced."""
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  traces = {"train_step": 0, "logprobs": 0}
  samplers = []
  make_train_step, make_logprob_fn, make_samplers = (run_lib.make_train_step, run_lib.make_logprob_fn,
                                                     run_lib.make_samplers)

  def counting(name, maker):
    def wrapped(*args, **kwargs):
      fn = maker(*args, **kwargs)

      def traced(*a):
        traces[name] += 1
        return fn(*a)
      return traced
    return wrapped

  def keep_samplers(*args):
    out = make_samplers(*args)
    samplers.extend(s for s in out if s is not None)
    return out

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(run_lib, "make_train_step", counting("train_step", make_train_step))
    mp.setattr(run_lib, "make_logprob_fn", counting("logprobs", make_logprob_fn))
    mp.setattr(run_lib, "make_samplers", keep_samplers)
    summary = loop.train(_config(), workdir)
  return workdir, summary, traces, samplers


def test_run_writes_metrics_samples_tensorboard_and_compiles_each_program_once(reference_run):
  workdir, summary, traces, samplers = reference_run
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records] == list(range(NUM_STEPS + 1))
  expected = {"reward", "reward_std", "rewards/exact_match/mean", "frac_reward_zero_std", "kl", "entropy",
              "clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "completions/mean_length",
              "completions/min_length", "completions/max_length", "completions/clipped_ratio",
              "learning_rate", "grad_norm", "step_time", "tokens_per_s", "logp_mismatch", "timing/sample_s",
              "timing/reward_s", "timing/update_s", "timing/other_s", "sampling/slot_utilization"}
  for r in records[1:]:
    assert expected <= set(r), expected - set(r)
    assert 0 < r["sampling/slot_utilization"] <= 1
  evals = [r["step"] for r in records if "eval/accuracy" in r]
  assert evals == [0, 3, 6]
  assert all("eval/pass@2" in r for r in records if "eval/accuracy" in r)
  # Samplers and trainer share the model code: their log-probs agree to float32 rounding.
  assert max(r["logp_mismatch"] for r in records[1:]) < 1e-3
  assert summary.accuracy_before == records[0]["eval/accuracy"]
  assert summary.accuracy_after == records[-1]["eval/accuracy"]
  assert os.path.exists(summary.plot_path)
  samples = read_jsonl(os.path.join(workdir, "samples.jsonl"))
  assert samples and {"step", "prompt", "completion", "reward"} <= set(samples[0])
  assert glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
  assert read_jsonl(os.path.join(workdir, "warmstart.jsonl"))
  with open(os.path.join(workdir, "summary.json")) as f:
    saved = json.load(f)
  assert saved["steps"] == NUM_STEPS
  # The time split: its additive parts are this process's wall time (what is left out: logging between steps);
  # the steps' phases are the sums of the timing/* metrics; launch comes before train() was called.
  split = saved["time_split_s"]
  parts = ("start", "eval", "checkpoint", "sample", "reward", "reference", "update", "sync", "step_other", "finish")
  assert set(parts) | {"launch", "first_step_excess"} == set(split) and min(split[p] for p in parts) >= 0
  assert sum(split[p] for p in parts) == pytest.approx(saved["wall_s_this_process"], rel=0.05)
  assert split["update"] == pytest.approx(sum(r["timing/update_s"] for r in records[1:]), abs=0.01)
  assert split["launch"] < saved["launch_to_first_step_s"] < split["launch"] + saved["wall_s_this_process"]
  # Per step: seconds since launch at the end of the update (before that step's evaluation), and what each
  # evaluation took (the warm start's evaluations are in split["eval"] too, not in metrics.jsonl).
  since = [r["timing/since_launch_s"] for r in records[1:]]
  assert since[0] == pytest.approx(saved["launch_to_first_step_s"], abs=0.5) and since == sorted(set(since))
  evals = {r["step"]: r["timing/eval_s"] for r in records if "timing/eval_s" in r}
  assert sorted(evals) == [r["step"] for r in records if "eval/accuracy" in r] and min(evals.values()) > 0
  assert sum(evals.values()) <= split["eval"] + 0.01
  # Dynamic sampling: every prompt block sampled counts in the data position (after the warm start's rows).
  rounds = [r["dynamic_sampling/rounds"] for r in records[1:]]
  assert all(1 <= n <= 3 for n in rounds) and all(0 <= r["dynamic_sampling/kept_groups"] <= 4 for r in records[1:])
  warmstart_rows = read_jsonl(os.path.join(workdir, "warmstart.jsonl"))[-1]["step"] * _config().warmstart.batch_size
  assert _final_meta(workdir)[1]["data_position"] == warmstart_rows + sum(rounds) * _config().grpo.prompts_per_step
  # One trace of the update and of the reference log-probs for the whole run; one program per sampler.
  assert traces == {"train_step": 1, "logprobs": 1}
  assert len(samplers) == 3  # training, greedy evaluation, pass@k
  for s in samplers:
    assert s.trace_counts["prefill"] == s.trace_counts["decode"] == 1, s.trace_counts


def _kill_at_step_5_then_resume(config, ref_dir, workdir):
  """Runs `config()` in workdir, killed while step 5 samples, then resumed: it must end as ref_dir's run did."""
  calls = {"n": 0}
  collect = producer_lib.collect_dynamic_rollout

  def dies_at_step_5(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] == 5:  # step 4 was logged, but the last checkpoint is step 3.
      raise KeyboardInterrupt("simulated kill")
    return collect(*args, **kwargs)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(producer_lib, "collect_dynamic_rollout", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
      loop.train(config(), workdir)
  assert [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == [0, 1, 2, 3, 4]

  summary = loop.train(config(), workdir)  # resumes from step 3
  assert _metrics(workdir) == _metrics(ref_dir)
  assert _final_checksum(workdir) == _final_checksum(ref_dir)
  return summary


def test_killed_and_resumed_run_ends_identical(reference_run, tmp_path):
  workdir = str(tmp_path / "killed")
  summary = _kill_at_step_5_then_resume(_config, reference_run[0], workdir)
  # Wall time: this process's, plus what the killed process of the same run had spent up to step 3.
  with open(os.path.join(workdir, "checkpoints", "3", "meta", "metadata")) as f:
    before = json.load(f)["elapsed_s"]
  assert 0 < before and 0 < summary.wall_s_this_process
  assert summary.wall_s == summary.wall_s_total == pytest.approx(before + summary.wall_s_this_process)
  with open(os.path.join(workdir, "summary.json")) as f:
    assert json.load(f)["wall_s_total"] == summary.wall_s_total


@pytest.fixture(scope="module")
def gemma3_checkpoint(tmp_path_factory):
  """grpo_jax.testing' tiny random Gemma 3: a sliding layer (window 4, shorter than prompt + completion,
  so its ring-buffer cache wraps) and a global layer, with a Gemma-like tokenizer."""
  from grpo_jax.testing import build_gemma3_checkpoint
  return build_gemma3_checkpoint(str(tmp_path_factory.mktemp("fixtures") / "tiny_gemma3"))


# With the faults marker: the default suite kills and resumes the default model's run (above, and
# tests/train/test_faults.py); Gemma 3 trains two steps and checkpoints in tests/recipes (its :test presets).
@pytest.mark.faults
def test_killed_and_resumed_gemma3_run_ends_identical(gemma3_checkpoint, compile_cache, tmp_path):
  def config():
    c = _config(gemma3_checkpoint)
    c.eval.samples, c.eval.pass_k, c.eval.maj_k = 1, (1,), ()  # one sampler program fewer to compile
    # A random model never answers a sum exactly; digits in the completion vary between its samples, so the
    # groups carry an advantage and the update moves the policy on every CPU.
    c.reward_funcs = ("tests.rewards.isolation_rewards:digit_count",)
    return c

  ref_dir = str(tmp_path / "uninterrupted")
  loop.train(config(), ref_dir)
  with open(os.path.join(ref_dir, "config.json")) as f:  # the run is the Gemma checkpoint's, not the preset's
    saved = json.load(f)
  assert saved["model"]["hf_path"] == gemma3_checkpoint
  records = read_jsonl(os.path.join(ref_dir, "metrics.jsonl"))
  assert [r["step"] for r in records] == list(range(NUM_STEPS + 1)) and max(r["grad_norm"] for r in records[1:]) > 0
  _kill_at_step_5_then_resume(config, ref_dir, str(tmp_path / "killed"))


def _donor_on_a_store(ref_dir: str, store) -> str:
  """A workdir on `store` holding the starting point of the run in `ref_dir`, as a run there writes it: the
  parameters saved through orbax (committed the store's way), and the warm start's log."""
  donor, config = store.url("donor"), _config()
  run = run_lib.Run(checks.validate(config), RunInputs(), lambda *_: None, TimeSplit())
  template = checkpoint_lib.abstract_like(run.policy.base_part(run.initial_params))
  params, meta = checkpoint_lib.restore_params(RunFiles(ref_dir).warmstart, 0, template)
  checkpoint_lib.save_initial_state(RunFiles(donor).warmstart, params, meta)
  storage.copy(RunFiles(ref_dir).warmstart_log, RunFiles(donor).warmstart_log)
  return donor


def test_run_started_from_another_runs_warm_start_on_a_store_equals_it(reference_run, tmp_path, gcs):
  """A gs:// warmstart.init_checkpoint (a local one: tests/train/default_fingerprint.py's LoRA run)."""
  ref_dir = reference_run[0]
  # The donor's step-0 checkpoint was rotated out (keep=2); its warmstart/ directory stays.
  assert not os.path.exists(os.path.join(ref_dir, "checkpoints", "0"))
  donor = _donor_on_a_store(ref_dir, gcs)
  workdir = str(tmp_path / "from_donor")
  config = _config()
  config.warmstart.init_checkpoint = donor
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop, "run_warmstart", lambda *a, **k: pytest.fail("the warm start ran again"))
    loop.train(config, workdir)
  assert _metrics(workdir) == _metrics(ref_dir)
  assert _final_checksum(workdir) == _final_checksum(ref_dir)
  with open(os.path.join(ref_dir, "warmstart.jsonl")) as a, open(os.path.join(workdir, "warmstart.jsonl")) as b:
    assert a.read() == b.read()


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(reference_run, tmp_path):
  ref_dir = reference_run[0]
  workdir = str(tmp_path / "corrupt")
  shutil.copytree(ref_dir, workdir)
  latest = os.path.join(workdir, "checkpoints", str(NUM_STEPS))
  data_files = [f for f in glob.glob(os.path.join(latest, "state", "**", "d", "*"), recursive=True)
                if os.path.isfile(f)]
  assert data_files
  for f in data_files:  # a half-written disk: every data file truncated
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)
  os.remove(os.path.join(workdir, "run_id"))  # checkpoints copied from another run: its time is not ours
  with pytest.warns(RuntimeWarning, match=f"checkpoint at step {NUM_STEPS}.*falling back"):
    summary = loop.train(_config(), workdir)
  assert summary.wall_s_total == summary.wall_s_this_process
  assert os.path.isdir(os.path.join(workdir, "checkpoints_damaged", str(NUM_STEPS)))
  # Steps 4..6 were redone from the step-3 checkpoint and give the same result.
  assert _metrics(workdir) == _metrics(ref_dir)
  assert _final_checksum(workdir) == _final_checksum(ref_dir)


def test_no_readable_checkpoint_refuses_instead_of_overwriting_the_history(reference_run, tmp_path):
  workdir = str(tmp_path / "all_corrupt")
  shutil.copytree(reference_run[0], workdir)
  for f in glob.glob(os.path.join(workdir, "checkpoints", "*", "state", "**", "d", "*"), recursive=True):
    if os.path.isfile(f):
      with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
  history = open(os.path.join(workdir, "metrics.jsonl"), "rb").read()
  for attempt in range(2):  # the second launch finds no checkpoint at all: it must still refuse
    with pytest.warns(RuntimeWarning) if attempt == 0 else contextlib.nullcontext():
      with pytest.raises(RuntimeError, match=rf"history of {NUM_STEPS} GRPO steps .* no readable checkpoint"):
        loop.train(_config(), workdir)
  assert open(os.path.join(workdir, "metrics.jsonl"), "rb").read() == history


def test_plot_script_draws_several_runs(reference_run, tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  shutil.copy(os.path.join(reference_run[0], "metrics.jsonl"), other)
  out = str(tmp_path / "both.png")
  plot_command.main([reference_run[0], str(other), "--out", out])
  with open(out, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with pytest.raises(FileNotFoundError, match="metrics.jsonl"):  # the library's error; the command's: one line
    plot_command.run([str(tmp_path / "missing"), "--out", out])


@pytest.mark.parametrize("main", [True, False])
def test_data_report_is_printed_by_the_main_process_only(main, tmp_path, capsys):
  def fake_make_task(config, log=print, **in_memory_rows):
    log("[data] a report line")
    raise RuntimeError("stop after the task")

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop.distributed, "is_main", lambda: main)
    mp.setattr(build, "make_task", fake_make_task)
    with pytest.raises(RuntimeError, match="stop after the task"):
      loop.train(_config(), str(tmp_path))
  assert ("[data] a report line" in capsys.readouterr().out) == main


def test_a_changed_setting_on_resume_is_refused_and_the_workdir_left_as_it_was(reference_run, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(reference_run[0], workdir)
  def files():  # every file but the lock's holder line, rewritten by each launch
    return {path: open(path, "rb").read() for path in glob.glob(os.path.join(workdir, "**", "*"), recursive=True)
            if os.path.isfile(path) and not path.endswith(".lock")}

  before = files()
  changed = _config()
  changed.grpo.beta = 0.0
  changed.optim.learning_rate = 1e-2
  with pytest.raises(ValueError, match=r"(?s)grpo\.beta: 0\.04 -> 0\.0.*optim\.learning_rate: "):
    loop.train(changed, workdir)
  assert files() == before  # metrics, checkpoints and config.json untouched

  # Changes that leave the experiment the same (logging, cadence, the stopping step) resume.
  same = _config()
  same.log.samples_every = 5
  same.checkpoint.keep = 3
  assert loop.train(same, workdir).steps == NUM_STEPS


def test_a_run_saved_before_the_settings_tree_resumes(reference_run, tmp_path):
  """A config.json written by an older grpo_jax: a key this code no longer has (task.holdout_fraction) and no env
  or precision section. It still reads as settings, and the run resumes from its last checkpoint under today's
  config."""
  workdir = str(tmp_path / "old")
  shutil.copytree(reference_run[0], workdir)
  path = os.path.join(workdir, "config.json")
  with open(path) as f:
    saved = json.load(f)
  saved["task"]["holdout_fraction"] = saved["task"]["heldout_fraction"]
  del saved["env"], saved["precision"]
  with open(path, "w") as f:
    json.dump(saved, f, indent=2, sort_keys=True)

  assert checks.validate(config_lib.saved_with_defaults(saved)) == Settings.from_config(_config())
  longer = _config()
  longer.num_steps = NUM_STEPS + 2  # a resumable change: two more steps
  summary = loop.train(longer, workdir)
  assert summary.steps == NUM_STEPS + 2
  steps = [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  assert steps == list(range(NUM_STEPS + 3))  # steps 7 and 8 after the saved history, none repeated
  assert _metrics(workdir)[:NUM_STEPS + 1] == _metrics(reference_run[0])


def test_a_second_launch_on_a_workdir_in_use_refuses_before_touching_it(tmp_path):
  workdir = str(tmp_path / "busy")
  with WorkdirLock(workdir):  # a first run holds the workdir
    with pytest.raises(RuntimeError, match=rf"in use by process {os.getpid()} on "):
      loop.train(_config(), workdir)
    assert os.listdir(workdir) == [".lock"]
  with WorkdirLock(workdir):  # released when its holder ends: the next launch may take it
    pass


@register_reward("test_loop_length", overwrite=True)
def _length_reward(prompts, completions, **unused_columns):
  del prompts, unused_columns
  return [len(c) / 4 for c in completions]


def test_a_diverging_run_stops_naming_the_cause_and_never_saves_non_finite_parameters(tmp_path):
  config = load_experiment("default")("test")
  config.num_steps = 8
  config.optim.learning_rate = 1e12
  config.rewards["test_loop_length"] = 1.0  # varies between completions: every update has a gradient
  workdir = str(tmp_path / "diverging")
  with pytest.raises(FloatingPointError, match=r"not finite|every update had a non-finite"):
    loop.train(config, workdir)
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  diverged_after = records[-1]["step"]   # the last update that was applied: its parameters overflow
  assert diverged_after < config.num_steps
  # No checkpoint holds the overflowing parameters: the newest is from before that update.
  saved = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
  assert saved and max(saved) < diverged_after


def test_evaluate_script_pass_k_near_zero_temperature_equals_greedy(reference_run, capsys, monkeypatch):
  """pass@K from samples at temperature 1e-6 (each sample is the argmax, so every one of the K is the greedy
  completion) equals the greedy accuracy; at temperature 1 it is another number, printed. The tiny random model
  gets no sum right, so the accuracy reward is swapped for one it meets about half the time (an even-length
  completion text), and the equality is not 0 == 0."""
  import re
  original = build.build_reward_fns

  def even_length(prompts, completions, **unused):
    return [float(len(c) % 2 == 0) for c in completions]

  def with_even_length(config, *args):
    return [(name, even_length if name == config.eval.accuracy_reward else fn, w) for name, fn, w in
            original(config, *args)]
  monkeypatch.setattr(build, "build_reward_fns", with_even_length)
  evaluate_command.run([reference_run[0], "--examples", "0", "--pass_k", "4", "--maj_k", "4", "--temperature", "1e-6"])
  out = capsys.readouterr().out
  greedy, full = re.search(r"accuracy (\S+), full credit (\S+),", out).groups()
  pass_k, maj_k = (re.search(rf"{name}\s+(\S+)\s+\[\S+, \S+\]\s+(?:wilson|bca), 4 samples at T 1e-06", out).group(1)
                   for name in ("pass@4", "maj@4"))
  assert pass_k == maj_k == greedy == full and 0 < float(greedy) < 1   # a 0/1 reward: full credit is the accuracy
  evaluate_command.run([reference_run[0], "--examples", "0", "--pass_k", "4"])
  assert re.search(r"pass@4 .* 4 samples at T 1\n", capsys.readouterr().out)
  # Half credit for an odd length: accuracy = 0.5 + 0.5 x (the share with full credit, the even ones).
  monkeypatch.setattr(build, "build_reward_fns", lambda config, *args: [
      (name, (lambda p, c, **u: [1.0 if len(x) % 2 == 0 else 0.5 for x in c]) if name == config.eval.accuracy_reward
       else fn, w) for name, fn, w in original(config, *args)])
  evaluate_command.run([reference_run[0], "--examples", "0"])
  partial, full_share = map(float, re.search(r"accuracy (\S+), full credit (\S+),", capsys.readouterr().out).groups())
  assert full_share == float(full) and partial == pytest.approx(0.5 + 0.5 * full_share, abs=1e-3)


def test_evaluate_script_reproduces_the_runs_final_accuracy_and_exports_the_policy(reference_run, tmp_path, capsys):
  import jax
  import numpy as np
  from grpo_jax.model import hf_io
  workdir = reference_run[0]
  out = str(tmp_path / "policy")
  evaluate_command.run([workdir, "--examples", "2", "--export", out])
  printed = capsys.readouterr().out
  final = read_jsonl(os.path.join(workdir, "metrics.jsonl"))[-1]["eval/accuracy"]
  assert f"(checkpoint {NUM_STEPS}), heldout, " in printed and f"accuracy {final:.3f}, full credit " in printed
  assert "finished " in printed and printed.count("] ...") == 2
  # The exported directory holds the checkpoint's parameters in the Hugging Face layout.
  from flax import nnx
  from grpo_jax.persist.checkpoint import restore_params
  exported_state = nnx.state(hf_io.from_pretrained(out))
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), exported_state)
  saved, _ = restore_params(os.path.join(workdir, "checkpoints"), NUM_STEPS, abstract)
  for a, b in zip(jax.tree.leaves(exported_state), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_lays_the_parameters_out_as_the_trainer_did(reference_run, tmp_path):
  # The run's config saved again with the mesh of a run on 2 devices whose sampler owns one: mesh.data 1 is the
  # trainer's device alone. grpo-export on 2 devices takes the trainer's mesh (a mesh of data 1 over both devices
  # does not exist: it failed there before).
  import subprocess
  import sys
  from tests.virtual_devices import env_with_devices
  workdir = str(tmp_path / "run")
  shutil.copytree(reference_run[0], workdir)
  files = RunFiles(workdir)
  config = json.loads(storage.read_text(files.config))
  config["mesh"]["data"] = 1
  config["rollout"].update(sampler_devices=1, staleness=1)
  storage.write_text(files.config, json.dumps(config))
  out = str(tmp_path / "policy")
  proc = subprocess.run([sys.executable, "-m", "grpo_jax.commands.export", workdir, out], env=env_with_devices(2),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and f"checkpoint {NUM_STEPS} -> {out}" in proc.stdout, proc.stderr[-3000:]


def test_evaluate_script_writes_rows_that_give_back_every_figure(reference_run, capsys, tmp_path):
  """--out writes one row per prompt; every printed figure and interval is recomputed from the rows alone."""
  import json
  import re
  from grpo_jax.train.evaluation import figures_of_rows
  out_file = str(tmp_path / "rows.jsonl")
  evaluate_command.run([reference_run[0], "--examples", "0", "--samples", "4", "--pass_k", "1,4", "--maj_k", "3",
                        "--temperature", "1.5", "--out", out_file])
  printed = {name: tuple(map(float, values)) for name, *values in re.findall(
      r"^\s+(\S+@\d+|accuracy|full_credit)\s+(\S+)\s+\[(\S+), (\S+)\]", capsys.readouterr().out, re.M)}
  assert set(printed) == {"accuracy", "full_credit", "avg@4", "pass@1", "pass@4", "maj@3"}
  with open(out_file) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == len({r["prompt"] for r in rows}) > 1 and all(len(r["samples"]) == 4 for r in rows)
  sample = rows[0]["samples"][0]
  assert set(sample) == {"answer", "reward", "correct", "completion"} and sample["correct"] == (sample["reward"] >= 1)
  figures = figures_of_rows(rows, pass_k=(1, 4), maj_k=(3,))
  for name, (value, lo, hi) in printed.items():
    assert (figures[f"eval/{name}"], figures[f"eval/{name}/lo"], figures[f"eval/{name}/hi"]) == pytest.approx(
        (value, lo, hi), abs=5e-4), name
  assert printed["pass@1"][0] == pytest.approx(printed["avg@4"][0], abs=1e-3)  # a 0/1 reward: pass@1 = avg@N
  assert printed["pass@1"][0] <= printed["pass@4"][0]
