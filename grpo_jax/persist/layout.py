"""The files of a run's workdir, named here and nowhere else: the trainer writes them (grpo_jax/persist/workdir.py
and the writers it holds), the sweep, the reports and the commands read them, from any machine and without JAX.
`RunFiles(workdir)` holds their paths (local, gs:// or s3://: grpo_jax/storage.py):

  config.json          the config the run started with, as the user wrote it (a resume compares it)
  run_id               the run's id, also in its checkpoints: whose time a resume counts
  .lock, .lease        held while the run lives: a file lock locally, a lease on a store (workdir_lock.py)
  inputs.json          a notebook's in-memory inputs, named and hashed (inputs.py)
  metrics.jsonl        one row per logged step; samples.jsonl: sampled completions; warmstart.jsonl: the warm start
  eval/step_<N>.jsonl  the per-prompt rows of the held-out evaluation at step N
  tensorboard/         TensorBoard's event files
  checkpoints/<N>/     orbax checkpoints (an unreadable one is moved to checkpoints_damaged/)
  warmstart/0/         the parameters GRPO started from, never rotated out: what other runs start from
  curves.png           the training curves; hf_model/: the policy as a Hugging Face directory (checkpoint.export_hf)
  summary.json         written once the run reached its last step: the run is finished

Which checkpoints are committed is orbax's to say (`committed_steps`): locally a directory renamed from its
temporary name, on a store one whose commit_success.txt is written. Asking imports orbax (and JAX) but starts
no JAX backend: a sweep driver asking about a donor leaves the accelerators to its members' trainers.
"""
from __future__ import annotations

from grpo_jax import storage


TRAIN_LOG = "train.log"  # a sweep member's trainer output


def sweep_file(sweep_dir: str) -> str:
  """sweep.json: the sweep's plan, written by its runner into the sweep directory."""
  return storage.join(sweep_dir, "sweep.json")


class RunFiles:
  """The paths of the files of the run in `root` (module docstring)."""

  def __init__(self, root: str):
    self.root = root
    join = lambda name: storage.join(root, name)  # noqa: E731
    self.config, self.run_id, self.inputs, self.summary = map(join, ("config.json", "run_id", "inputs.json",
                                                                     "summary.json"))
    self.lock, self.lease = join(".lock"), join(".lease")
    self.metrics, self.samples, self.warmstart_log = map(join, ("metrics.jsonl", "samples.jsonl", "warmstart.jsonl"))
    self.eval_dir, self.tensorboard, self.curves, self.hf_model = map(join, ("eval", "tensorboard", "curves.png",
                                                                             "hf_model"))
    self.checkpoints, self.warmstart = join("checkpoints"), join("warmstart")
    self.damaged = damaged_dir(self.checkpoints)
    # A sweep member's workdir also holds the sweep runner's files (grpo_jax/sweep/runner.py says what each means).
    self.member, self.train_log, self.attempts = map(join, ("member.json", TRAIN_LOG, "attempts.jsonl"))
    self.done, self.failed = join("DONE"), join("FAILED")

  def eval_rows(self, step: int) -> str:
    return storage.join(self.eval_dir, f"step_{step}.jsonl")

  def eval_row_steps(self) -> list[int]:
    """The steps whose held-out evaluation rows the run wrote, ascending."""
    names = [n for n in storage.listdir(self.eval_dir) if n.startswith("step_") and n.endswith(".jsonl")]
    return sorted(int(n[5:-6]) for n in names if n[5:-6].isdigit())

  def starting_point(self) -> str | None:
    """The orbax directory whose committed step 0 is the state this run started GRPO from: its warmstart/ (after a
    warm start, never rotated out), else its checkpoints/ while they hold step 0; `root` itself when it is such a
    directory. None when there is none."""
    return next((d for d in (self.warmstart, self.checkpoints, self.root) if 0 in committed_steps(d)), None)


def damaged_dir(checkpoints: str) -> str:
  return checkpoints.rstrip("/") + "_damaged"


def committed_steps(directory: str) -> list[int]:
  """The steps of the committed checkpoints in `directory` ([] when it does not exist), as orbax counts them."""
  from orbax.checkpoint import path as orbax_path
  options = storage.orbax_options(directory)  # on a store: committed by a commit file, not a rename
  return sorted(int(name) for name in storage.listdir(directory)
                if name.isdigit() and orbax_path.step.is_path_finalized(storage.join(directory, name), **options))
