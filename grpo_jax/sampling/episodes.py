"""Multi-turn episodes: the policy's messages alternate with an environment's observations (grpo_jax/envs).

`EpisodeSampler.generate` has `Sampler.generate`'s signature and returns the episode as one completion, so the
rollout, the update and evaluation treat it like a single-turn one:

  completion_BxC      the episode after the prompt: message 1, observation 1, message 2, ... (C = max_episode_tokens)
  completion_mask_BxC 1 on the policy's tokens only: observations are context, never trained on or counted
  env_mask_BxC        1 on observation tokens
  answer_start_B      the column where the last message starts (the rewards grade that message)

Turn k samples every unfinished episode in one call of the jitted turn sampler (a `Sampler` whose stop ids
include the environment's `stop_strings`) on the context prompt + episode so far: turn 1 shares each prompt's
prefill among its G rows, later turns prefill each row's own context (the environment runs on the host between
calls, so the cache does not carry over). Contexts are padded to the turn sampler's `prompt_widths`, so a run
compiles one prefill and one decode per (width, batch bucket) it meets.

An episode ends when the environment says done, after `max_turns` messages, when a message does not fit in the
episode's C columns (cut), or when an observation leaves no room for another message. `truncated_B` is True
unless the environment ended it. An environment whose `reset` or `step` raises, or does not return within
`step_timeout_s`, ends that episode there (counted in `env_failures_B`, the first failure of a call logged); the
run goes on. (A step that hangs keeps its thread, a daemon, which cannot be stopped from outside.)
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from grpo_jax.data.text import decode_text, encode_text
from grpo_jax.envs.base import Environment, StepResult

logger = logging.getLogger(__name__)


class EpisodeResult(NamedTuple):
  """numpy arrays, B rows (groups contiguous), P prompt width, C = max_episode_tokens."""
  prompt_BxP: np.ndarray           # int32, left padded
  prompt_mask_BxP: np.ndarray      # int32
  completion_BxC: np.ndarray       # int32 episode tokens, pad_id after the episode
  completion_mask_BxC: np.ndarray  # int32, 1 on the policy's tokens
  logp_BxC: np.ndarray             # float32 sampler log-probs of the policy's tokens, 0 elsewhere
  lengths_B: np.ndarray            # int32 policy tokens in the episode
  truncated_B: np.ndarray          # bool: the environment did not end the episode
  env_mask_BxC: np.ndarray         # int32, 1 on observation tokens
  answer_start_B: np.ndarray       # int32 first column of the last message
  env_reward_B: np.ndarray         # float32 sum of the environment's step rewards
  turns_B: np.ndarray              # int32 messages the policy wrote
  env_failures_B: np.ndarray       # bool: the environment raised (the episode ended there)


def _call_with_timeout(fn: Callable, args: tuple, timeout_s: float) -> Any:
  """fn(*args) in a daemon thread; its exception re-raised, TimeoutError after `timeout_s` seconds."""
  box: dict[str, Any] = {}

  def target():
    try:
      box["value"] = fn(*args)
    except BaseException as e:  # handed to the caller
      box["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    raise TimeoutError(f"no answer within {timeout_s:g} s")
  if "error" in box:
    raise box["error"]
  return box["value"]


class EpisodeSampler:
  """`EpisodeSampler(turn_sampler, make_env, tokenizer, max_turns=, max_episode_tokens=).generate(state, prompts,
  key, repeats)`; `turn_sampler.cfg.max_new_tokens` bounds each message, `max_observation_tokens` each
  observation (longer ones are cut), `step_timeout_s` each call of the environment."""

  def __init__(self, turn_sampler, make_env: Callable[[], Environment], tokenizer, *, max_turns: int,
               max_episode_tokens: int, max_observation_tokens: int = 32, step_timeout_s: float = 10.0):
    if max_turns < 1 or max_episode_tokens < 1 or max_observation_tokens < 1:
      raise ValueError(f"EpisodeSampler: max_turns={max_turns}, max_episode_tokens={max_episode_tokens} and "
                       f"max_observation_tokens={max_observation_tokens} must be >= 1")
    self.turn_sampler = turn_sampler
    self.make_env = make_env
    self.tokenizer = tokenizer
    self.max_turns = max_turns
    self.max_episode_tokens = max_episode_tokens
    self.max_observation_tokens = max_observation_tokens
    self.step_timeout_s = step_timeout_s
    self.cfg = turn_sampler.cfg

  def generate(self, state, prompts: list[list[int]], key: jax.Array, repeats: int = 1) -> EpisodeResult:
    G, C, tok = repeats, self.max_episode_tokens, self.tokenizer
    prompts = [list(map(int, p)) for p in prompts]
    B = len(prompts) * G
    failed = np.zeros(B, bool)

    def call(b, fn, *args):
      """fn(*args), or None after marking episode b failed (the first failure of this call is logged)."""
      try:
        return _call_with_timeout(fn, args, self.step_timeout_s)
      except Exception as e:  # an environment's bug must not end the run: the episode ends, and is counted
        if not failed.any():
          logger.warning("environment %s raised %s: %s (episode ended; counted in episodes/env_failures)",
                         type(envs[b]).__name__, type(e).__name__, e)
        failed[b] = True
        return None

    envs = [self.make_env() for _ in range(B)]
    for b, env in enumerate(envs):
      call(b, env.reset, decode_text(tok, prompts[b // G]))
    tokens = [[] for _ in range(B)]      # the episode after the prompt
    policy = [[] for _ in range(B)]      # 1: the policy's token, 0: an observation's
    logp = [[] for _ in range(B)]
    answer_start, turns = np.zeros(B, np.int32), np.zeros(B, np.int32)
    env_reward, finished = np.zeros(B, np.float32), np.zeros(B, bool)
    active, first = list(range(B)), None
    for turn in range(self.max_turns):
      if turn == 0:  # every row, each prompt's prefill shared by its G rows
        out = first = self.turn_sampler.generate(state, prompts, key, repeats=G)
      else:
        contexts = [prompts[b // G] + tokens[b] for b in active]
        out = self.turn_sampler.generate(state, contexts, jax.random.fold_in(key, turn))
      still = []
      for i, b in enumerate(active):
        real = out.completion_mask_BxC[i].astype(bool)
        ids, lps = out.completion_BxC[i][real].tolist(), out.logp_BxC[i][real].tolist()
        room = C - len(tokens[b])
        answer_start[b], turns[b] = len(tokens[b]), turns[b] + 1
        tokens[b] += ids[:room]
        policy[b] += [1] * len(ids[:room])
        logp[b] += lps[:room]
        if len(ids) > room:  # the message does not fit: the episode ends, cut
          continue
        result = None if failed[b] else call(b, envs[b].step, decode_text(tok, ids))
        if not isinstance(result, StepResult):
          if result is not None:  # a step that returned something else is a failure too
            call(b, _bad_result, result)
          continue
        env_reward[b] += float(result.reward)
        if result.done:
          finished[b] = True
          continue
        if turn == self.max_turns - 1:  # out of messages: the observation would be read by nobody
          continue
        observation = encode_text(tok, result.observation)[:self.max_observation_tokens]
        if len(tokens[b]) + len(observation) >= C:  # no room left for another message
          continue
        tokens[b] += observation
        policy[b] += [0] * len(observation)
        logp[b] += [0.0] * len(observation)
        still.append(b)
      active = still
      if not active:
        break
    return self._pack(first, tokens, policy, logp, answer_start, env_reward, turns, finished, failed)

  def _pack(self, first, tokens, policy, logp, answer_start, env_reward, turns, finished, failed) -> EpisodeResult:
    B, C = len(tokens), self.max_episode_tokens
    completion = np.full((B, C), self.cfg.pad_id, np.int32)
    mask, env_mask = np.zeros((B, C), np.int32), np.zeros((B, C), np.int32)
    logp_BxC = np.zeros((B, C), np.float32)
    for b in range(B):
      n = len(tokens[b])
      completion[b, :n] = tokens[b]
      mask[b, :n] = policy[b]
      env_mask[b, :n] = 1 - np.asarray(policy[b], np.int32)
      logp_BxC[b, :n] = logp[b]
    return EpisodeResult(first.prompt_BxP, first.prompt_mask_BxP, completion, mask, logp_BxC,
                         mask.sum(axis=1).astype(np.int32), ~finished, env_mask, answer_start, env_reward, turns,
                         failed)


def _bad_result(result):
  raise TypeError(f"Environment.step returned {type(result).__name__}, not a StepResult")

