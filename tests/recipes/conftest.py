"""Shared fixtures of the recipe tests: the tiny checkpoint + datasets (built once per module into a tmp
dir that the `:test` presets find through $GRPO_JAX_FIXTURES), and a persistent XLA cache."""
from __future__ import annotations

import pytest

from grpo_jax import testing
from grpo_jax.rewards import register_reward
from tests.train.conftest import compile_cache, load_experiment  # noqa: F401  (re-exported fixtures/helpers)


@register_reward("recipes_test_digit_fraction", overwrite=True)
def digit_fraction(prompts, completions, **unused_columns):
  """Fraction of digit characters: varies between random completions, so the tiny runs' updates are not 0."""
  del prompts, unused_columns
  return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


@pytest.fixture(scope="module")
def fixture_paths(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("fixtures") / "built")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("GRPO_JAX_FIXTURES", directory)
    yield testing.ensure_fixtures()
