# Multi-turn episodes with a tool: 2-digit products, with a calculator the policy may call.
#   python scripts/train.py --config experiments/calculator.py --workdir runs/calculator
# A smoke test at tiny shapes: --config experiments/calculator.py:test.
"""Products of two 2-digit numbers ("37*48=" -> "1776"), too hard for the default experiment's 2-layer model to
work out, with the calculator environment (grpo_jax/envs/calculator.py): a message ending in "?" is a tool call
and the episode continues after the calculator's answer, "37*48?" -> "[1776]" -> "1776". Up to 3 messages of at
most 8 tokens each, 24 columns per episode; the exact-match reward grades the last message, and the
calculator's answers are context, never trained on.

The warm start imitates the tool-using episode for 10% of the rows and the bare product for the others, and
stops at 10% held-out greedy accuracy: the policy then calls the tool on about a third of the prompts and
mostly guesses the rest. GRPO (G = 8 x 32 prompts, beta = 0, Adam lr 3e-4) should raise both the share of
episodes that call the tool (episodes/turns -> 2) and the accuracy.
"""
from grpo_jax.sweep.spec import sibling_experiment


def get_config(preset: str | None = None):
  c = sibling_experiment(__file__, "default.py").get_config(preset)
  c.task.name = "tool_arithmetic"
  c.task.tool_fraction = 0.1
  c.warmstart.target_accuracy = 0.1
  c.env.update(name="calculator", max_turns=3, max_episode_tokens=24, max_observation_tokens=8)
  c.sampling.max_prompt_length = 8
  c.sampling.max_new_tokens = 8
  c.model.max_position_embeddings = 32
  if preset != "test":
    c.num_steps = 200
    c.log.progress_bar = False
  return c
