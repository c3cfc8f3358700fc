"""What a notebook may hand a run besides its config: reward callables, datasets in memory, step callbacks.

    from grpo_jax.train.loop import train
    summary = train(config, workdir,
                    reward_funcs=[brevity],                    # fn(prompts, completions, **columns) -> scores
                    reward_weights=[0.1],                      # default 1.0 each
                    train_dataset=rows,                        # list of dicts, or a datasets.Dataset
                    eval_dataset=None,                         # None: task.heldout_fraction of train_dataset
                    callbacks=[stop_at_accuracy])              # fn(step, metrics) -> True to stop after it

The launcher (grpo-train) runs the same `train` without them. Reward callables add to the config's
`rewards` / `reward_funcs`, under their `__name__`. A dataset needs `task.name = "dataset"` (its rows are read
like a file's rows: grpo_jax/data/datasets.py) and replaces `task.train_path` / `task.heldout_path`. A callback
sees each step's metrics after they are logged; returning True ends the run after that step, with a
checkpoint, so the same command resumes it later.

None of these are in config.json, so a resume could not tell them apart: WORKDIR/inputs.json records the
callables' names and a SHA-256 of each dataset, and a resume with other ones is refused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable, Sequence

from grpo_jax import storage

StepCallback = Callable[[int, dict], Any]


@dataclasses.dataclass(frozen=True)
class RunInputs:
  reward_funcs: Sequence[Callable] = ()
  reward_weights: Sequence[float] | None = None
  train_dataset: Any = None
  eval_dataset: Any = None
  callbacks: Sequence[StepCallback] = ()

  def __post_init__(self):
    if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
      raise ValueError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.reward_funcs)} "
                       "reward_funcs")
    for fn in list(self.reward_funcs) + list(self.callbacks):
      if not callable(fn):
        raise TypeError(f"reward_funcs and callbacks take callables, got {fn!r}")
    if self.eval_dataset is not None and self.train_dataset is None:
      raise ValueError("eval_dataset needs a train_dataset (or give task.heldout_path in the config)")

  def reward_specs(self) -> list[tuple[str, Callable, float]]:
    """(name, function, weight) of each reward callable; the name is its `__name__`."""
    weights = self.reward_weights or [1.0] * len(self.reward_funcs)
    specs = [(getattr(fn, "__name__", type(fn).__name__), fn, float(w)) for fn, w in zip(self.reward_funcs, weights)]
    names = [name for name, _, _ in specs]
    if len(set(names)) != len(names):
      raise ValueError(f"reward_funcs: two callables share a name ({names}); rename one")
    return specs

  def fingerprint(self) -> dict:
    return {"reward_funcs": [name for name, _, _ in self.reward_specs()],
            "train_dataset": _rows_sha256(self.train_dataset), "eval_dataset": _rows_sha256(self.eval_dataset)}


def _rows_sha256(dataset) -> str | None:
  if dataset is None:
    return None
  digest = hashlib.sha256()
  for row in dataset:
    digest.update(json.dumps(dict(row), sort_keys=True, default=str).encode())
  return digest.hexdigest()


def check_or_record(path: str, inputs: RunInputs, resuming: bool, main: bool) -> None:
  """Records the in-memory inputs of a new run at `path` (its inputs.json); refuses a resume whose inputs differ
  from the recorded ones."""
  now = inputs.fingerprint()
  if resuming:
    saved = {"reward_funcs": [], "train_dataset": None, "eval_dataset": None}  # a run started without any
    if storage.exists(path):
      saved = json.loads(storage.read_text(path))
    changed = [k for k in now if saved.get(k) != now[k]]
    if changed:
      raise ValueError(f"the workdir holds a run started with other in-memory inputs ({', '.join(changed)} differ "
                       f"from {path}); pass the same ones to resume it, or use a new workdir")
  elif main:
    storage.write_text(path, json.dumps(now, indent=2))
