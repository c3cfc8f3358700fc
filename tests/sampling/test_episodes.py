"""Multi-turn episodes: the calculator against Python's arithmetic, episode assembly (masks, answer, budget) by a
scripted policy worked out by hand, and the real sampler's log-probs against the trainer's teacher-forced ones
on the assembled episodes (which holds only if the trainer sees the contexts the sampler saw)."""
from __future__ import annotations

import random
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.envs import Environment, StepResult, env_factory, stop_token_ids
from grpo_jax.envs.calculator import Calculator, evaluate_expression
from grpo_jax.model import ModelConfig, Transformer, completion_logprobs
from grpo_jax.rewards import get_reward
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.sampling.episodes import EpisodeResult, EpisodeSampler, hung_env_calls
from grpo_jax.sampling.sampler import SampleResult
from grpo_jax.train.rollout import (RolloutSpec, Scoring, build_rollout, episode_metrics, rollout_metrics,
                                    sample_and_score)
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

TOK = CharTokenizer("0123456789+-*=?[]")


def test_calculator_matches_python_arithmetic_and_rejects_other_text():
  rng = random.Random(0)
  for _ in range(300):
    n = rng.randint(1, 4)
    operands = [str(rng.randint(0, 999)) for _ in range(n)]
    ops = [rng.choice("+-*") for _ in range(n - 1)]
    text = operands[0] + "".join(o + x for o, x in zip(ops, operands[1:]))
    assert evaluate_expression(text) == eval(text), text  # Python's own precedence as the reference
  for bad in ("", "3+", "*3", "3**4", "2+3+4+5+6", "1234567*2", "4/2", "(1+2)", "__import__('os')"):
    assert evaluate_expression(bad) is None, bad


def test_calculator_protocol():
  env = env_factory("calculator")()
  env.reset("37*48=")
  assert env.step("37*48?") == StepResult("[1776]", 0.0, False)
  assert env.step("37*?") == StepResult("[?]", 0.0, False)
  assert env.step("1776") == StepResult("", 0.0, True)
  limited = Calculator(max_calls=1)
  assert limited.step("2*3?").done
  assert stop_token_ids(env, TOK) == (TOK.encode("?")[0],)
  with pytest.raises(ValueError, match="unknown environment 'abacus'"):
    env_factory("abacus")
  assert env_factory("grpo_jax.envs.calculator:Calculator") is Calculator  # an import path
  with pytest.raises(ValueError, match="cannot import environment"):
    env_factory("grpo_jax.envs.calculator:Abacus")


class _Scripted:
  """A turn sampler whose message depends only on the context's text: `script(context) -> message` (ending in
  the stop token "\\x01" to stop on it). Log-prob of each token: -(its position in the message + 1) / 10."""

  def __init__(self, script, max_new_tokens=8):
    self.script = script
    self.cfg = SamplingConfig(max_new_tokens=max_new_tokens, stop_ids=(1, TOK.encode("?")[0]), pad_id=0)
    self.contexts = []

  def generate(self, state, prompts, key, repeats=1):
    rows = [p for p in prompts for _ in range(repeats)]
    B, C = len(rows), self.cfg.max_new_tokens
    comp, mask, logp = np.zeros((B, C), np.int32), np.zeros((B, C), np.int32), np.zeros((B, C), np.float32)
    truncated = np.zeros(B, bool)
    for b, ids in enumerate(rows):
      text = TOK.decode(ids)
      self.contexts.append(text)
      message = self.script(text)
      stop = message.endswith("\x01")
      out = TOK.encode(message.rstrip("\x01")) + ([1] if stop else [])
      truncated[b] = not (stop or message.endswith("?")) or len(out) > C
      out = out[:C]
      comp[b, :len(out)], mask[b, :len(out)] = out, 1
      logp[b, :len(out)] = -(np.arange(len(out)) + 1) / 10
    P = max(len(p) for p in prompts)
    prompt = np.array([[0] * (P - len(p)) + p for p in rows], np.int32)
    return SampleResult(prompt, (prompt > 0).astype(np.int32), comp, mask, logp, mask.sum(1), truncated)


def _script(context: str) -> str:
  """Calls the calculator once, then answers with what it said; "99*99=" asks and asks again."""
  if context.startswith("99*99="):
    return "99*99?"
  if context.endswith("]"):
    return context[context.rindex("[") + 1:-1] + "\x01"
  return context[:-1] + "?"


def test_episode_assembly_by_hand():
  sampler = EpisodeSampler(_Scripted(_script), Calculator, TOK, max_turns=3, max_episode_tokens=16)
  prompts = [TOK.encode("12*34="), TOK.encode("99*99=")]
  out = sampler.generate(None, prompts, jax.random.key(0), repeats=2)
  assert isinstance(out, EpisodeResult) and out.completion_BxC.shape == (4, 16)
  # Row 0: "12*34?" (6, policy) "[408]" (5, observation) "408" + stop (4, policy): 15 columns.
  expected = TOK.encode("12*34?[408]408") + [1, 0]
  np.testing.assert_array_equal(out.completion_BxC[0], expected)
  np.testing.assert_array_equal(out.completion_mask_BxC[0], [1] * 6 + [0] * 5 + [1] * 4 + [0])
  np.testing.assert_array_equal(out.env_mask_BxC[0], [0] * 6 + [1] * 5 + [0] * 5)
  np.testing.assert_allclose(out.logp_BxC[0], [-.1, -.2, -.3, -.4, -.5, -.6] + [0] * 5 + [-.1, -.2, -.3, -.4, 0])
  assert (out.answer_start_B[0], out.lengths_B[0], out.turns_B[0], out.truncated_B[0]) == (11, 10, 2, False)
  np.testing.assert_array_equal(out.completion_BxC[1], out.completion_BxC[0])  # same script, same group
  # Row 2: "99*99?" "[9801]", then "99*99?" again, which does not fit: cut after 4 of its 6 tokens, unfinished.
  np.testing.assert_array_equal(out.completion_BxC[2][:12], TOK.encode("99*99?[9801]"))
  assert (out.answer_start_B[2], out.lengths_B[2], out.turns_B[2], out.truncated_B[2]) == (12, 10, 2, True)
  # Turn 2's contexts were the prompts followed by the episode so far.
  assert "12*34=12*34?[408]" in sampler.turn_sampler.contexts

  # The rewards grade the last message; the transcript is a column the rewards may read.
  seen = {}

  def remember(prompts, completions, transcript, **_):
    seen.update(zip(completions, transcript))
    return [0.0] * len(completions)

  settings = RolloutSpec(group_size=2, max_prompt_length=8, scoring=Scoring(
      [("exact_match", get_reward("exact_match"), 1.0), ("remember", remember, 1.0)], timeout_s=10.0, fallback=0.0,
      isolation="thread"), advantage="grpo", std_ddof=1, advantage_eps=1e-4, mask_truncated=False)
  columns = {"prompt": ["12*34=", "99*99="], "answer": ["408", "9801"]}
  scored = sample_and_score(sampler, None, TOK, columns, settings, jax.random.key(0))
  np.testing.assert_array_equal(scored.rewards_B, [1, 1, 0, 0])
  assert seen["408"] == "12*34?[408]408" and scored.completions[0] == "12*34?[408]408"
  metrics = rollout_metrics(scored)
  assert metrics["episodes/turns"] == 2 and metrics["episodes/observation_tokens"] == 5.5
  assert metrics["episodes/unfinished"] == 0.5 and metrics["completions/mean_length"] == 10
  batch = build_rollout(scored, metrics, settings).batch
  np.testing.assert_array_equal(batch.completion_mask_BxC, out.completion_mask_BxC)  # observations: no loss


class _Flaky(Environment):
  """Raises on a message containing "3", returns a wrong type on one containing "5", hangs on one containing "7",
  else ends the episode."""
  stop_strings = ("?",)

  def step(self, message):
    if "3" in message:
      raise RuntimeError("flaky tool")
    if "5" in message:
      return "not a StepResult"
    if "7" in message:
      time.sleep(30)
    return StepResult("", 1.0, True)


def test_an_environment_that_raises_or_hangs_ends_its_episode_and_is_counted():
  sampler = EpisodeSampler(_Scripted(lambda context: context[:-1] + "\x01"), _Flaky, TOK, max_turns=2,
                           max_episode_tokens=10, step_timeout_s=0.5)
  t0 = time.perf_counter()
  out = sampler.generate(None, [TOK.encode(p) for p in ("12*34=", "2*2=", "5*6=", "7*8=")], jax.random.key(0))
  assert time.perf_counter() - t0 < 10  # the hanging step was given up after 0.5 s
  np.testing.assert_array_equal(out.env_failures_B, [True, False, True, True])
  np.testing.assert_array_equal(out.truncated_B, [True, False, True, True])
  np.testing.assert_array_equal(out.env_reward_B, [0, 1, 0, 0])
  metrics = episode_metrics(out)
  assert metrics["episodes/env_failures"] == 3
  assert metrics["episodes/hung_calls"] == hung_env_calls() >= 1  # the sleeping step still runs in its thread


class _Meeting(Environment):
  """Every step waits at one barrier of 4 parties (1 s at most): it passes only when 4 steps run at once."""
  stop_strings = ("?",)
  barrier = None

  def step(self, message):
    self.barrier.wait(timeout=1.0)
    return StepResult("", 1.0, True)


@pytest.mark.parametrize("max_concurrent", [4, 2])
def test_the_episodes_environment_steps_of_a_turn_run_concurrently(max_concurrent):
  _Meeting.barrier = threading.Barrier(4)
  sampler = EpisodeSampler(_Scripted(lambda context: context[:-1] + "\x01"), _Meeting, TOK, max_turns=1,
                           max_episode_tokens=10, step_timeout_s=5.0, max_concurrent_steps=max_concurrent)
  out = sampler.generate(None, [TOK.encode("1+1="), TOK.encode("2+2=")], jax.random.key(0), repeats=2)
  # 4 at once: all meet; 2 at a time: the barrier breaks, and each failed step ends its episode, counted.
  np.testing.assert_array_equal(out.env_failures_B, [max_concurrent < 4] * 4)
  np.testing.assert_array_equal(out.env_reward_B, [float(max_concurrent >= 4)] * 4)


class _Echo(Environment):
  """Answers every message with "[7]" and a reward of 0.25; never ends an episode."""
  stop_strings = ("?",)

  def step(self, message):
    return StepResult("[7]", 0.25, False)


def test_real_sampler_logprobs_match_the_trainers_on_assembled_episodes():
  cfg = ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=64)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  turn = Sampler(graphdef, SamplingConfig(max_new_tokens=6, stop_ids=(1, TOK.encode("?")[0]), pad_id=0,
                                          temperature=1.0), prompt_widths=(8, 16, 24, 32))
  sampler = EpisodeSampler(turn, _Echo, TOK, max_turns=3, max_episode_tokens=24)
  prompts = [TOK.encode(p) for p in ("12*34=", "5*6=", "99*9=", "1+2=")]
  out = sampler.generate(params, prompts, jax.random.key(3), repeats=4)
  # The random policy emits "?" often enough that some episodes have several messages and observations.
  assert out.turns_B.max() >= 2 and out.env_mask_BxC.sum() > 0
  # Every message that fits is passed to the environment, which pays 0.25 for each.
  assert np.all((out.env_reward_B <= 0.25 * out.turns_B) & (out.env_reward_B >= 0.25 * (out.turns_B - 1)))
  logp, _ = completion_logprobs(nnx.merge(graphdef, params), out.prompt_BxP, out.prompt_mask_BxP,
                                out.completion_BxC, out.completion_mask_BxC, 1.0, 128)
  policy = out.completion_mask_BxC > 0
  # The trainer's forward against the sampler's cached decode: 1.2 ulps of the largest seen, 50 the old atol.
  assert_close_f32(np.asarray(logp)[policy], out.logp_BxC[policy], ulps=64)
  assert np.all(out.logp_BxC[out.env_mask_BxC > 0] == 0)
