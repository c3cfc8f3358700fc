"""The model families' recipes (mixtures of experts, Qwen3.5, Gemma 4): their `:test` presets end to end on the tiny
random fixtures, as tests/recipes/test_recipes.py checks the others (a separate file so the suite runs both at once)."""
from __future__ import annotations

import pytest

from tests.recipes.test_recipes import FAMILY_RECIPES, check_test_preset_run


@pytest.mark.parametrize("name", FAMILY_RECIPES)
def test_test_preset_runs_two_steps_and_checkpoints(name, fixture_paths, compile_cache, tmp_path, capsys):
  check_test_preset_run(name, fixture_paths, tmp_path, capsys)
