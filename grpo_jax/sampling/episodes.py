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
run goes on. (A step that hangs keeps its thread, a daemon, which cannot be stopped from outside.) The calls of
one turn (the resets, then each turn's steps) run concurrently, `max_concurrent_steps` at a time.
"""
from __future__ import annotations

import abc
import logging
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from grpo_jax import timed_calls
from grpo_jax.sampling.text import decode_text, encode_text

logger = logging.getLogger(__name__)


class StepResult(NamedTuple):
  observation: str   # appended to the context after the message ("" for none); ignored when done
  reward: float      # added to the episode's reward
  done: bool


class Environment(abc.ABC):
  """One episode's environment: made fresh for every row (`make_env`), so it may keep per-episode state. The
  interface the episodes run (grpo_jax/envs/base.py: what an environment is, the registry of them)."""

  # Strings that end a message besides the stop token, e.g. the end of a tool call. A tokenizer must encode
  # each to exactly one token (the sampler stops on token ids).
  stop_strings: tuple[str, ...] = ()

  def reset(self, prompt: str) -> None:
    """Called once with the episode's prompt, before its first message."""

  @abc.abstractmethod
  def step(self, message: str) -> StepResult:
    """The environment's answer to the policy's message (its text without the stop token)."""


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


_hung = timed_calls.Abandoned()  # timed-out environment calls, counted until they return


def hung_env_calls() -> int:
  """How many timed-out environment calls are still running in threads in the background."""
  return _hung.count()


class EpisodeSampler:
  """`EpisodeSampler(turn_sampler, make_env, tokenizer, max_turns=, max_episode_tokens=).generate(state, prompts,
  key, repeats)`; `turn_sampler.cfg.max_new_tokens` bounds each message, `max_observation_tokens` each
  observation (longer ones are cut), `step_timeout_s` each call of the environment; the episodes' calls of one
  turn run concurrently in threads, at most `max_concurrent_steps` at once (tools that wait on I/O, a sandbox
  or a server overlap; pure-Python ones take turns on the GIL as they would one after another)."""

  def __init__(self, turn_sampler, make_env: Callable[[], Environment], tokenizer, *, max_turns: int,
               max_episode_tokens: int, max_observation_tokens: int = 32, step_timeout_s: float = 10.0,
               max_concurrent_steps: int = 64):
    if min(max_turns, max_episode_tokens, max_observation_tokens, max_concurrent_steps) < 1:
      raise ValueError(f"EpisodeSampler: max_turns={max_turns}, max_episode_tokens={max_episode_tokens}, "
                       f"max_observation_tokens={max_observation_tokens} and max_concurrent_steps="
                       f"{max_concurrent_steps} must be >= 1")
    self.turn_sampler = turn_sampler
    self.make_env = make_env
    self.tokenizer = tokenizer
    self.max_turns = max_turns
    self.max_episode_tokens = max_episode_tokens
    self.max_observation_tokens = max_observation_tokens
    self.step_timeout_s = step_timeout_s
    self.max_concurrent_steps = max_concurrent_steps
    self.cfg = turn_sampler.cfg

  def generate(self, state, prompts: list[list[int]], key: jax.Array, repeats: int = 1) -> EpisodeResult:
    G, C, tok = repeats, self.max_episode_tokens, self.tokenizer
    prompts = [list(map(int, p)) for p in prompts]
    B = len(prompts) * G
    failed = np.zeros(B, bool)

    def call_all(calls: list[tuple[int, Callable, tuple]], steps: bool) -> dict[int, Any]:
      """Episode b -> its fn(*args), or None after marking b failed (the first failure of a generate is logged):
      an environment's bug or hang must not end the run, only its episode, and it is counted. A step must
      return a StepResult; what a reset returns is ignored."""
      out = {}
      done = timed_calls.call_all([(fn, args) for _, fn, args in calls], self.step_timeout_s, _hung,
                                   max_concurrent=self.max_concurrent_steps, name="env-call")
      for (b, _, _), (ok, value) in zip(calls, done):
        if ok and (not steps or isinstance(value, StepResult)):
          out[b] = value
          continue
        if ok:  # a step that returned something else is a failure too
          value = TypeError(f"Environment.step returned {type(value).__name__}, not a StepResult")
        if not failed.any():
          logger.warning("environment %s raised %s: %s (episode ended; counted in episodes/env_failures); "
                         "timed-out calls still running in the background: %d", type(envs[b]).__name__,
                         type(value).__name__, value, hung_env_calls())
        failed[b], out[b] = True, None
      return out

    envs = [self.make_env() for _ in range(B)]
    call_all([(b, env.reset, (decode_text(tok, prompts[b // G]),)) for b, env in enumerate(envs)], steps=False)
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
      stepping = []  # the episodes whose message fits, and whose environment still works, take a step
      for i, b in enumerate(active):
        real = out.completion_mask_BxC[i].astype(bool)
        ids, lps = out.completion_BxC[i][real].tolist(), out.logp_BxC[i][real].tolist()
        room = C - len(tokens[b])
        answer_start[b], turns[b] = len(tokens[b]), turns[b] + 1
        tokens[b] += ids[:room]
        policy[b] += [1] * len(ids[:room])
        logp[b] += lps[:room]
        if len(ids) <= room and not failed[b]:  # else the episode ends: cut, or its environment failed
          stepping.append((b, envs[b].step, (decode_text(tok, ids),)))
      results = call_all(stepping, steps=True)
      still = []
      for b, _, _ in stepping:
        result = results[b]
        if result is None:  # failed
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
