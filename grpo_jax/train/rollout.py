"""One rollout: prompts -> sampler (G per prompt) -> decoded completions -> weighted rewards -> advantages.

Everything here runs on the host between jitted programs (the sampler and the update), on numpy arrays.
Shapes: R prompts, G completions per prompt, B = R * G (groups contiguous), P prompt length, C completion
length (= max_new_tokens).
"""
from __future__ import annotations

import dataclasses
import time

from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from grpo_jax.algo.advantages import compute_advantages, group_stats
from grpo_jax.sampling.text import decode_text, encode_text
from grpo_jax.rewards.scoring import RewardResult, score_completions
from grpo_jax.sampling.episodes import EpisodeResult, hung_env_calls
from grpo_jax.train.step import RolloutBatch

RewardSpec = tuple[str, Callable, float]

# One small program each (eagerly, every jnp op would be its own compiled program).
_advantages = jax.jit(compute_advantages, static_argnums=(1, 2, 3, 4))
_group_stats = jax.jit(group_stats, static_argnums=(1, 2))


def decode_completion(tokenizer, ids_N: np.ndarray, mask_N: np.ndarray) -> str:
  """The completion's text: its real tokens, without the stop token."""
  return decode_text(tokenizer, [t for t, m in zip(ids_N, mask_N) if m])


def encode_prompts(tokenizer, prompts: Sequence[str], max_prompt_length: int) -> list[list[int]]:
  out = []
  for text in prompts:
    ids = encode_text(tokenizer, text)
    if not ids:
      raise ValueError(f"prompt {text!r} encodes to no tokens")
    if len(ids) > max_prompt_length:
      raise ValueError(f"prompt {text[:80]!r} has {len(ids)} tokens, more than "
                       f"config.sampling.max_prompt_length={max_prompt_length}")
    out.append(ids)
  return out


def repeat_columns(columns: dict[str, list], times: int) -> dict[str, list]:
  """Each row repeated `times` times in place (the layout of groups)."""
  return {k: [v for v in vals for _ in range(times)] for k, vals in columns.items()}


class Scoring(NamedTuple):
  """How completions are scored: the (name, fn, weight) rewards, each call's timeout in seconds, the score of a
  call that fails, and where the functions run ("process" or "thread": grpo_jax/rewards/isolation.py). No
  defaults here: a run's come from its settings (`scoring_of`)."""
  reward_fns: Sequence[RewardSpec]
  timeout_s: float
  fallback: float
  isolation: str

  def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list]):
    return score_completions(list(self.reward_fns), prompts, completions, columns, timeout_s=self.timeout_s,
                             fallback=self.fallback, isolation=self.isolation)


class RolloutSpec(NamedTuple):
  """What a rollout needs besides the sampler and the prompts: built once per run (`from_settings`; the defaults
  and the meaning of each field are grpo_jax/settings.py's)."""
  group_size: int                 # G
  max_prompt_length: int
  scoring: Scoring
  advantage: str
  std_ddof: int
  advantage_eps: float
  mask_truncated: bool            # DAPO: completions that hit max_new_tokens get no loss

  @classmethod
  def from_settings(cls, settings, reward_fns: Sequence[RewardSpec]) -> "RolloutSpec":
    """From the run's settings (grpo_jax/settings.py)."""
    g = settings.grpo
    return cls(group_size=g.group_size, max_prompt_length=settings.sampling.max_prompt_length,
               scoring=scoring_of(settings, reward_fns), advantage=g.advantage, std_ddof=g.std_ddof,
               advantage_eps=g.advantage_eps, mask_truncated=g.mask_truncated_completions)


def scoring_of(settings, reward_fns: Sequence[RewardSpec]) -> Scoring:
  """The run's reward functions with its settings' timeout, fallback and isolation."""
  return Scoring(reward_fns, settings.reward_timeout_s, settings.reward_fallback, settings.reward_isolation)


class Rollout(NamedTuple):
  batch: RolloutBatch     # numpy arrays, ready for the update (ref_logp_BxC still None)
  metrics: dict[str, float]
  prompts: list[str]      # [B]
  completions: list[str]  # [B]
  rewards_B: np.ndarray
  num_tokens: int         # real prompt + completion tokens
  # Wall time of (sampling, reward functions): counted by the step that sampled it (producer.py), not saved.
  seconds: tuple[float, float] = (0.0, 0.0)
  # Rollouts that span updates (grpo_jax/train/partial.py): the policy step that sampled each completion token
  # (int32 [B, C], -1 past its end), else None.
  policy_BxC: np.ndarray | None = None


def saved_rollout(rollout: Rollout) -> tuple[dict[str, np.ndarray], dict]:
  """A pending rollout as a checkpoint keeps it: (its arrays, the rest as JSON)."""
  arrays = {k: np.asarray(v) for k, v in rollout.batch._asdict().items() if v is not None}
  plain = lambda v: v.item() if isinstance(v, np.generic) else v
  if rollout.policy_BxC is not None:
    arrays["policy_BxC"] = np.asarray(rollout.policy_BxC)
  return dict(arrays, rewards_B=np.asarray(rollout.rewards_B)), {
      "metrics": {k: plain(v) for k, v in rollout.metrics.items()}, "prompts": list(rollout.prompts),
      "completions": list(rollout.completions), "num_tokens": int(rollout.num_tokens)}


def restored_rollout(arrays: dict[str, np.ndarray], info: dict) -> Rollout:
  """The inverse of `saved_rollout`."""
  arrays = {k: np.asarray(v) for k, v in arrays.items()}
  batch = RolloutBatch(**{f: arrays.get(f) for f in RolloutBatch._fields})
  # (checkpoints before the producer counted time kept the sampling seconds among the metrics)
  metrics = {k: v for k, v in info["metrics"].items() if not k.startswith("timing/")}
  return Rollout(batch, metrics, list(info["prompts"]), list(info["completions"]),
                 arrays["rewards_B"], int(info["num_tokens"]), policy_BxC=arrays.get("policy_BxC"))


class Scored(NamedTuple):
  """Sampled and scored completions of whole groups (rows of a group contiguous), before advantages."""
  sample: Any               # a SampleResult of numpy arrays, [B, ...]
  prompts: list[str]        # [B]
  completions: list[str]    # [B]
  rewards_B: np.ndarray     # float32 weighted total
  per_fn: dict[str, np.ndarray]
  failures: dict[str, int]
  std_R: np.ndarray         # the within-group std of each group's rewards (with std_ddof)
  zero_std_R: np.ndarray    # bool: every reward of the group is equal (no policy gradient)
  seconds: tuple[float, float] = (0.0, 0.0)  # wall time of (sampling, reward functions)


def sample_and_score(sampler, params, tokenizer, columns: dict[str, list], settings: RolloutSpec,
                     key) -> Scored:
  """Samples G completions for each of the R prompts in `columns["prompt"]` and scores them."""
  G = settings.group_size
  texts = list(columns["prompt"])
  prompt_ids = encode_prompts(tokenizer, texts, settings.max_prompt_length)
  t0 = time.perf_counter()
  out = sampler.generate(params, prompt_ids, key, repeats=G)  # one prefill per prompt, G rows each
  return scored_sample(tokenizer, out, columns, settings, time.perf_counter() - t0)


def scored_sample(tokenizer, out, columns: dict[str, list], settings: RolloutSpec, sample_s: float = 0.0) -> Scored:
  """Scores a sampler's result `out`, G rows for each of the prompts in `columns["prompt"]` (`sample_s`: the
  seconds its sampling took)."""
  G, texts = settings.group_size, list(columns["prompt"])
  if not np.all(np.isfinite(out.logp_BxC[out.completion_mask_BxC > 0])):
    # NaN/inf logits: the sampled ids are meaningless (possibly outside the vocabulary). Name the cause.
    raise FloatingPointError("the policy's log-probs of its own samples are not finite: its parameters overflow "
                             "(a learning rate too high, float16 overflow, or non-finite rewards earlier); the "
                             "last checkpoint holds the parameters before it diverged")

  prompts_B = [t for t in texts for _ in range(G)]
  t2 = time.perf_counter()
  result, graded_B, transcripts_B = grade(tokenizer, out, prompts_B, repeat_columns(
      {k: v for k, v in columns.items() if k != "prompt"}, G), settings.scoring)
  rewards_B = np.asarray(result.total, np.float32)
  stats = jax.device_get(_group_stats(rewards_B, G, settings.std_ddof))
  return Scored(out, prompts_B, transcripts_B or graded_B, rewards_B,
                {k: np.asarray(v) for k, v in result.per_fn.items()}, dict(result.failures),
                np.asarray(stats.std_R), np.asarray(stats.zero_std_R), seconds=(sample_s, time.perf_counter() - t2))


def grade(tokenizer, out, prompts_B: list[str], columns_B: dict[str, list],
          scoring: Scoring) -> tuple[RewardResult, list[str], list[str] | None]:
  """(rewards, the texts graded, the transcripts or None) of a sampler's result `out` ([B] rows, `columns_B` the
  rows' other columns; `completion_length` is added). Single turn: the completions are graded. Multi-turn
  (`EpisodeResult`): each episode's last message is graded, the rewards also receive its `transcript` (messages
  and observations), and the environment's step rewards are added to the total (per_fn "environment")."""
  columns_B = dict(columns_B, completion_length=out.lengths_B.tolist())
  if not isinstance(out, EpisodeResult):
    completions = [decode_completion(tokenizer, c, m) for c, m in zip(out.completion_BxC, out.completion_mask_BxC)]
    return scoring(prompts_B, completions, columns_B), completions, None
  answers, transcripts = [], []
  for c, m, e, s in zip(out.completion_BxC, out.completion_mask_BxC, out.env_mask_BxC, out.answer_start_B):
    answers.append(decode_completion(tokenizer, c[s:], m[s:]))
    transcripts.append(decode_completion(tokenizer, c, m + e))
  result = scoring(prompts_B, answers, dict(columns_B, transcript=transcripts))
  result = dataclasses.replace(result, total=np.asarray(result.total, np.float32) + out.env_reward_B,
                               per_fn=dict(result.per_fn, environment=out.env_reward_B))
  return result, answers, transcripts


def concat_scored(parts: Sequence[Scored]) -> Scored:
  """The groups of several sampler calls, in order. Completions have one width; prompts, whose width follows
  each call's longest prompt, are left-padded to the widest (mask 0)."""
  if len(parts) == 1:
    return parts[0]
  cat = lambda xs: np.concatenate(list(xs), axis=0)
  P = max(p.sample.prompt_BxP.shape[1] for p in parts)
  widen = lambda x, p: np.pad(x, ((0, 0), (P - p, 0)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
  samples = [p.sample._replace(prompt_BxP=widen(p.sample.prompt_BxP, p.sample.prompt_BxP.shape[1]),
                               prompt_mask_BxP=widen(p.sample.prompt_mask_BxP, p.sample.prompt_BxP.shape[1]),
                               **_widened_experts(p.sample, widen)) for p in parts]
  first = parts[0]
  return Scored(
      sample=type(first.sample)(*[None if field[0] is None else cat(field) for field in zip(*samples)]),
      prompts=[t for p in parts for t in p.prompts], completions=[t for p in parts for t in p.completions],
      rewards_B=cat(p.rewards_B for p in parts),
      per_fn={k: cat(p.per_fn[k] for p in parts) for k in first.per_fn},
      failures={k: sum(p.failures.get(k, 0) for p in parts) for k in {k for p in parts for k in p.failures}},
      std_R=cat(p.std_R for p in parts), zero_std_R=cat(p.zero_std_R for p in parts),
      seconds=tuple(sum(p.seconds[i] for p in parts) for i in range(2)))


def _widened_experts(sample, widen) -> dict:
  """A SampleResult's experts, their prompt columns widened like its prompt (nothing for other samples)."""
  experts = getattr(sample, "experts_BxTxLxk", None)
  return {} if experts is None else {"experts_BxTxLxk": widen(experts, sample.prompt_BxP.shape[1])}


def take_groups(scored: Scored, groups_K: np.ndarray, group_size: int) -> Scored:
  """The groups `groups_K` (indices, in that order) of `scored`."""
  rows = (np.asarray(groups_K)[:, None] * group_size + np.arange(group_size)[None]).reshape(-1)
  return Scored(
      sample=type(scored.sample)(*[None if x is None else x[rows] for x in scored.sample]),
      prompts=[scored.prompts[i] for i in rows], completions=[scored.completions[i] for i in rows],
      rewards_B=scored.rewards_B[rows], per_fn={k: v[rows] for k, v in scored.per_fn.items()},
      failures=scored.failures, std_R=scored.std_R[groups_K], zero_std_R=scored.zero_std_R[groups_K],
      seconds=scored.seconds)


def rollout_metrics(scored: Scored) -> dict[str, Any]:
  """The names of docs/guide.md, "Metrics": reward, reward_std (mean within-group std), rewards/<fn>/mean and /std,
  frac_reward_zero_std, completions/{mean,min,max}_length, completions/clipped_ratio,
  completions/mean_length_{correct,incorrect} (total reward > 0, <= 0; absent when a step has none),
  and rewards/<fn>/failures when a reward function failed on some samples. (The wall time of sampling and of the
  reward functions is the Rollout's `seconds`.)"""
  lengths = scored.sample.lengths_B.astype(np.float64)
  metrics: dict[str, Any] = {
      "reward": float(scored.rewards_B.mean()),
      "reward_std": float(np.mean(scored.std_R)),
      "frac_reward_zero_std": float(np.mean(scored.zero_std_R)),
      "completions/mean_length": float(lengths.mean()),
      "completions/min_length": float(lengths.min()),
      "completions/max_length": float(lengths.max()),
      "completions/clipped_ratio": float(np.mean(scored.sample.truncated_B)),
  }
  correct = scored.rewards_B > 0  # a total reward > 0 counts as correct (exact for 0/1 accuracy rewards)
  for label, rows in (("correct", correct), ("incorrect", ~correct)):
    if rows.any():  # the length bias of Dr. GRPO (arXiv:2503.20783) shows in the incorrect ones
      metrics[f"completions/mean_length_{label}"] = float(lengths[rows].mean())
  if isinstance(scored.sample, EpisodeResult):  # lengths above count the policy's tokens only
    metrics.update(episode_metrics(scored.sample))
  for name, values in scored.per_fn.items():
    metrics[f"rewards/{name}/mean"] = float(np.mean(values))
    metrics[f"rewards/{name}/std"] = float(np.std(values))
    if scored.failures.get(name):
      metrics[f"rewards/{name}/failures"] = int(scored.failures[name])
  return metrics


def episode_metrics(out: EpisodeResult, prefix: str = "episodes/") -> dict[str, float]:
  """Multi-turn episodes: mean messages per episode (turns), observation tokens per episode, the fraction the
  environment did not end (unfinished: out of turns or of tokens, or it raised), the number of episodes that
  ended because the environment raised or timed out (env_failures), and, when there are any, the timed-out
  environment calls still running in background threads (hung_calls: a thread cannot be stopped)."""
  metrics = {f"{prefix}turns": float(np.mean(out.turns_B)),
             f"{prefix}observation_tokens": float(np.mean(out.env_mask_BxC.sum(axis=1))),
             f"{prefix}unfinished": float(np.mean(out.truncated_B)),
             f"{prefix}env_failures": int(np.sum(out.env_failures_B))}
  hung = hung_env_calls()
  if hung:
    metrics[f"{prefix}hung_calls"] = hung
  return metrics


def build_rollout(scored: Scored, metrics: dict[str, Any], settings: RolloutSpec,
                  num_tokens: int | None = None) -> Rollout:
  """The update's batch from scored groups: advantages, and the loss mask (DAPO overlong filtering)."""
  out, st = scored.sample, settings
  advantages_B = np.asarray(_advantages(scored.rewards_B, st.group_size, st.advantage, st.std_ddof,
                                        float(st.advantage_eps)))
  loss_mask_BxC = out.completion_mask_BxC.astype(np.int32)
  if st.mask_truncated:  # DAPO overlong filtering: truncated completions contribute no loss.
    loss_mask_BxC = loss_mask_BxC * (~out.truncated_B)[:, None].astype(np.int32)
  batch = RolloutBatch(
      prompt_BxP=out.prompt_BxP.astype(np.int32), prompt_mask_BxP=out.prompt_mask_BxP.astype(np.int32),
      completion_BxC=out.completion_BxC.astype(np.int32), completion_mask_BxC=loss_mask_BxC,
      advantages_B=advantages_B.astype(np.float32), sampler_logp_BxC=out.logp_BxC.astype(np.float32),
      ref_logp_BxC=None, experts_BxTxLxk=getattr(out, "experts_BxTxLxk", None))
  if num_tokens is None:
    num_tokens = int(out.prompt_mask_BxP.sum() + out.completion_mask_BxC.sum())
  return Rollout(batch, metrics, scored.prompts, scored.completions, scored.rewards_B, num_tokens, scored.seconds)


def collect_rollout(sampler, params, tokenizer, columns: dict[str, list], settings: RolloutSpec,
                    key) -> Rollout:
  """Samples G completions for each of the R prompts in `columns["prompt"]`, scores them, and builds the batch
  (metrics: `rollout_metrics`)."""
  scored = sample_and_score(sampler, params, tokenizer, columns, settings, key)
  return build_rollout(scored, rollout_metrics(scored), settings)


def select_signal_groups(zero_std_R: np.ndarray, num_groups: int) -> tuple[np.ndarray, int]:
  """(indices of `num_groups` groups, how many of them have signal): the first `num_groups` groups whose rewards
  differ, in sampling order; when fewer exist, the earliest zero-std groups fill the remaining slots (their
  advantages are 0 under every advantage method, so they add no policy gradient but keep the batch shape)."""
  zero_std_R = np.asarray(zero_std_R, bool)
  signal = np.flatnonzero(~zero_std_R)[:num_groups]
  fill = np.flatnonzero(zero_std_R)[:num_groups - len(signal)]
  if len(signal) + len(fill) < num_groups:
    raise ValueError(f"{len(zero_std_R)} sampled groups cannot fill a batch of {num_groups} groups")
  return np.concatenate([signal, fill]).astype(np.int64), len(signal)


def collect_dynamic_rollout(sampler, params, tokenizer, next_columns: Callable[[], dict[str, list]],
                            settings: RolloutSpec, key, *, max_rounds: int,
                            all_done: Callable[[bool], bool] = lambda done: done) -> Rollout:
  """DAPO dynamic sampling (docs/algorithms.md): groups whose rewards are all equal are dropped, and further batches of
  prompts (`next_columns()`, which also advances the data position) are sampled at the same shapes, so nothing
  recompiles, until the batch holds as many groups with signal as one call gives, or after `max_rounds` calls.
  Round r samples with fold_in(key, r) (round 0 with `key`, as without dynamic sampling). A batch still short
  after `max_rounds` is filled with zero-std groups (see `select_signal_groups`): the batch shape stays static.
  Multi-host: each process fills its own rows; `all_done(done)` is True when every process is done (a
  collective), so all processes make the same number of (collective) sampler calls.

  Metrics: `rollout_metrics` of every group sampled this step, before filtering (so frac_reward_zero_std is
  the sampled fraction), plus dynamic_sampling/rounds, dynamic_sampling/kept_groups (groups with signal in
  the batch) and dynamic_sampling/filled_groups (zero-std groups re-included to fill the batch).
  """
  parts: list[Scored] = []
  while True:
    columns = next_columns()
    num_groups = len(columns["prompt"])
    round_key = key if not parts else jax.random.fold_in(key, len(parts))
    parts.append(sample_and_score(sampler, params, tokenizer, columns, settings, round_key))
    have = sum(int(np.sum(~p.zero_std_R)) for p in parts)
    if all_done(have >= num_groups or len(parts) >= max_rounds):
      break
  scored = concat_scored(parts)
  groups_K, kept = select_signal_groups(scored.zero_std_R, num_groups)
  metrics = {**rollout_metrics(scored), "dynamic_sampling/rounds": len(parts), "dynamic_sampling/kept_groups": kept,
             "dynamic_sampling/filled_groups": num_groups - kept}
  num_tokens = int(scored.sample.prompt_mask_BxP.sum() + scored.sample.completion_mask_BxC.sum())
  return build_rollout(take_groups(scored, groups_K, settings.group_size), metrics, settings, num_tokens)


def bucket_widths(maximum: int, buckets: int, multiple: int = 8) -> tuple[int, ...]:
  """The widths ceil(k * maximum / buckets) rounded up to `multiple` (at most `maximum`), k = 1..buckets,
  ascending and distinct. E.g. maximum 48, 4 buckets: (16, 24, 40, 48); buckets <= 1: (maximum,)."""
  widths = {min(maximum, -(-(-(-k * maximum // buckets)) // multiple) * multiple)
            for k in range(1, max(buckets, 1) + 1)}
  return tuple(sorted(widths))


def bucket_width(used: int, maximum: int, buckets: int, multiple: int = 8) -> int:
  """The smallest of `bucket_widths(maximum, buckets, multiple)` that holds `used` columns (else maximum)."""
  return next((w for w in bucket_widths(maximum, buckets, multiple) if w >= used), maximum)


def trim_padding(batch: RolloutBatch, buckets: int, max_prompt_length: int | None = None) -> RolloutBatch:
  """The batch cut to bucket widths for the update: completion columns after the last real token of every row,
  and prompt columns of left padding before the longest prompt (see `bucket_width`); buckets <= 1: unchanged.
  Prompt widths are buckets of `max_prompt_length` (default: the batch's own width), the widths the trainer's
  sampler already pads to, so a sampled batch keeps its prompt width and no further shapes appear.

  The values do not change: attention is causal and positions count the prompt mask, so no kept column sees a
  cut one. What changes is the work: once a policy answers in 13 of 48 tokens, the update runs on 16 columns
  instead of 48, at the price of one compiled program per width used (at most `buckets` per side).
  """
  if buckets <= 1:
    return batch
  P, C = batch.prompt_BxP.shape[1], batch.completion_BxC.shape[1]
  real_columns = np.flatnonzero(np.any(np.asarray(batch.completion_mask_BxC) > 0, axis=0))
  n = bucket_width(int(real_columns[-1]) + 1 if real_columns.size else 1, C, buckets)
  prompt_columns = np.flatnonzero(np.any(np.asarray(batch.prompt_mask_BxP) > 0, axis=0))
  p = min(P, bucket_width(P - int(prompt_columns[0]) if prompt_columns.size else 1, max_prompt_length or P,
                          buckets))
  if (p, n) == (P, C):
    return batch
  tail = lambda x: None if x is None else x[:, :n]   # noqa: E731
  experts = batch.experts_BxTxLxk
  return batch._replace(prompt_BxP=batch.prompt_BxP[:, P - p:], prompt_mask_BxP=batch.prompt_mask_BxP[:, P - p:],
                        completion_BxC=tail(batch.completion_BxC),
                        completion_mask_BxC=tail(batch.completion_mask_BxC),
                        sampler_logp_BxC=tail(batch.sampler_logp_BxC), ref_logp_BxC=tail(batch.ref_logp_BxC),
                        experts_BxTxLxk=None if experts is None else experts[:, P - p:P + n])
