"""Rollouts that span updates (`rollout.decode_budget` = B > 0): batches in flight, decoded a segment of at most
B new tokens per policy, each segment by the newest policy the sampler holds.

Batch t (step t's prompts, the rows at the data position where it starts, and step t's key) starts with the
policy after p0 = max(0, t - 1 - k) updates (k = `rollout.staleness`) and takes one segment per policy after
that: token i of each of its completions is sampled by the policy after min(p0 + i // B, t - 1) updates (the
segment of policy t - 1 has no budget and finishes every row; a batch whose rows all stop earlier is complete
earlier). Row r's key is fold_in(fold_in(key(seed), t), r), and its token j draws from fold_in(row key, j)
(`Sampler.generate(row_keys=...)`), so a batch's tokens depend on its keys, prompts and this schedule alone, not
on the order in which the producer runs the segments: inline and overlapped give the same batches.

Each token keeps its behaviour log-prob (the sampler's, segments concatenated: the corrections read them per
token, grpo_jax/algo/corrections.py) and the policy step that sampled it (`Rollout.policy_BxC`; metrics
rollout/policy_step_{min,mean,max}). A segment continues the unfinished rows only, each row's prompt followed by
its tokens so far, prefilled again under the new weights (no KV cache survives a segment). A batch in flight is
host arrays (`InFlight`), which a checkpoint keeps (`saved_batch`): its rows' columns are read again from the
data at its position.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.sampling.sampler import SampleResult
from grpo_jax.train.rollout import (Rollout, RolloutSpec, build_rollout, encode_prompts, restored_rollout,
                                    rollout_metrics, saved_rollout, scored_sample)


class InFlight(NamedTuple):
  """A batch not yet complete: what its segments so far gave (host arrays; B rows, C = max_new_tokens)."""
  step: int                  # t: the step whose update learns from it
  position: int              # the data position its rows start at
  columns: dict              # its rows' columns (R prompts), read from the data at `position`
  key_data_BxK: np.ndarray   # uint32: each row's key
  prompt_BxP: np.ndarray     # int32, as the first segment padded them (the update's prompt width)
  prompt_mask_BxP: np.ndarray
  tokens_BxC: np.ndarray     # int32: the tokens so far, pad_id after
  logp_BxC: np.ndarray       # float32: each token's behaviour log-prob, 0 after
  policy_BxC: np.ndarray     # int32: the policy step that sampled each token, -1 after
  lengths_B: np.ndarray      # int32
  done_B: np.ndarray         # bool: stopped or truncated
  truncated_B: np.ndarray    # bool: no stop id within max_new_tokens
  policy: int                # the policy step of its last segment
  first_policy: int          # p0
  slot_steps: tuple = (0, 0)  # the decode's (slot-steps, kept slot-steps) over its segments


ARRAYS = ("key_data_BxK", "prompt_BxP", "prompt_mask_BxP", "tokens_BxC", "logp_BxC", "policy_BxC", "lengths_B",
          "done_B", "truncated_B")


def row_key_data(key, rows: int) -> np.ndarray:
  """uint32 [rows, K]: row r's key fold_in(key, r), as key data."""
  return np.asarray(jax.random.key_data(jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(rows))))


def segment(sampler, params, tokenizer, spec: RolloutSpec, batch: InFlight | None, policy: int,
            budget: int | None, start: tuple | None = None) -> tuple[InFlight, float]:
  """(`batch` advanced by one segment of `params`, the policy after `policy` updates: at most `budget` new tokens
  per row, None: to the end; the seconds it sampled). `batch` None starts one from `start` = (step, position,
  columns, key data)."""
  t0 = time.perf_counter()
  if batch is None:
    step, position, columns, key_data = start
    prompts = encode_prompts(tokenizer, list(columns["prompt"]), spec.max_prompt_length)
    G = spec.group_size
    out = sampler.generate(params, prompts, None, repeats=G, row_keys=key_data, budget=budget)
    B, C = out.completion_BxC.shape
    batch = InFlight(step, position, columns, key_data, out.prompt_BxP, out.prompt_mask_BxP,
                     out.completion_BxC.copy(), np.zeros((B, C), np.float32), np.full((B, C), -1, np.int32),
                     np.zeros(B, np.int32), np.zeros(B, bool), np.zeros(B, bool), policy, policy)
    rows = np.arange(B)
  else:
    G = spec.group_size
    prompts = encode_prompts(tokenizer, list(batch.columns["prompt"]), spec.max_prompt_length)
    rows = np.flatnonzero(~batch.done_B)
    out = sampler.generate(params, [prompts[r // G] for r in rows], None, row_keys=batch.key_data_BxK[rows],
                           prefixes=[batch.tokens_BxC[r, :batch.lengths_B[r]].tolist() for r in rows],
                           budget=budget)
    batch = batch._replace(**{k: getattr(batch, k).copy() for k in ARRAYS[3:]}, policy=policy)
  for i, r in enumerate(rows):  # the rows' new tokens after what they had
    begin, end = int(out.start_B[i]), int(out.lengths_B[i])
    assert begin == batch.lengths_B[r], (begin, batch.lengths_B[r])
    batch.tokens_BxC[r, begin:end] = out.completion_BxC[i, begin:end]
    batch.logp_BxC[r, begin:end] = out.logp_BxC[i, begin:end]
    batch.policy_BxC[r, begin:end] = policy
    batch.lengths_B[r] = end
  batch.done_B[rows] = ~out.unfinished_B
  batch.truncated_B[rows] = out.truncated_B
  if budget is None and not batch.done_B.all():
    raise AssertionError(f"batch {batch.step}: the segment without a budget left rows unfinished")
  return batch, time.perf_counter() - t0


def completed(batch: InFlight, tokenizer, spec: RolloutSpec) -> Rollout:
  """The Rollout of a batch whose rows are all done: scored, with its policy steps (metrics
  rollout/policy_step = its first policy, rollout/policy_step_{min,mean,max} over its completion tokens)."""
  C = batch.tokens_BxC.shape[1]
  mask_BxC = (np.arange(C)[None] < batch.lengths_B[:, None]).astype(np.int32)
  out = SampleResult(prompt_BxP=batch.prompt_BxP, prompt_mask_BxP=batch.prompt_mask_BxP,
                     completion_BxC=batch.tokens_BxC, completion_mask_BxC=mask_BxC, logp_BxC=batch.logp_BxC,
                     lengths_B=batch.lengths_B, truncated_B=batch.truncated_B)
  scored = scored_sample(tokenizer, out, batch.columns, spec)
  steps = batch.policy_BxC[mask_BxC > 0]
  metrics = {**rollout_metrics(scored), "rollout/policy_step": batch.first_policy,
             "rollout/policy_step_min": int(steps.min()), "rollout/policy_step_mean": float(steps.mean()),
             "rollout/policy_step_max": int(steps.max())}
  if batch.slot_steps[0]:
    metrics["sampling/slot_utilization"] = batch.slot_steps[1] / batch.slot_steps[0]
  return build_rollout(scored, metrics, spec)._replace(policy_BxC=batch.policy_BxC)


def saved_batch(batch) -> tuple[dict[str, np.ndarray], dict]:
  """A pending batch, complete (`saved_rollout`) or in flight, as a checkpoint keeps it: (arrays, JSON)."""
  if not isinstance(batch, InFlight):
    return saved_rollout(batch)
  arrays = {k: np.asarray(getattr(batch, k)) for k in ARRAYS}
  arrays["done_B"], arrays["truncated_B"] = batch.done_B.astype(np.int32), batch.truncated_B.astype(np.int32)
  return arrays, {"in_flight": {"step": batch.step, "position": batch.position, "policy": batch.policy,
                                "first_policy": batch.first_policy, "slot_steps": list(batch.slot_steps)}}


def restored_batch(arrays: dict, info: dict, columns_at: Callable[[int], dict]):
  """The inverse of `saved_batch`; `columns_at(position)`: the rows' columns at a data position."""
  if "in_flight" not in info:
    return restored_rollout(arrays, info)
  i = info["in_flight"]
  a = {k: np.asarray(arrays[k]) for k in ARRAYS}
  a["done_B"], a["truncated_B"] = a["done_B"].astype(bool), a["truncated_B"].astype(bool)
  return InFlight(step=int(i["step"]), position=int(i["position"]), columns=columns_at(int(i["position"])),
                  policy=int(i["policy"]), first_policy=int(i["first_policy"]),
                  slot_steps=tuple(int(x) for x in i["slot_steps"]), **a)
