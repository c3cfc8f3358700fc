import pytest

from grpo_jax.rewards import exact_match, get_reward, list_rewards, register_reward
from grpo_jax.rewards import registry


def test_builtin_names_resolve_to_functions():
  assert get_reward("exact_match") is exact_match
  assert "exact_match" in list_rewards()


def test_callable_passes_through_and_import_path_resolves():
  fn = lambda prompts, completions, **cols: [0.0] * len(completions)
  assert get_reward(fn) is fn
  assert get_reward("grpo_jax.rewards.exact:exact_match") is exact_match


def test_register_and_duplicate_names(monkeypatch):
  monkeypatch.setattr(registry.REWARDS, "_entries", dict(registry.REWARDS._entries))

  @register_reward("my_len")
  def my_len(prompts, completions, **cols):
    return [float(len(c)) for c in completions]

  assert get_reward("my_len") is my_len
  register_reward("my_len")(my_len)  # the same object again is fine
  with pytest.raises(ValueError, match="already registered"):
    register_reward("my_len")(lambda p, c, **k: [])
  other = lambda p, c, **k: []
  register_reward("my_len", overwrite=True)(other)
  assert get_reward("my_len") is other
  register_reward("my_len", overwrite=True)(my_len)
  assert get_reward("my_len") is my_len

  # A re-run notebook cell defines a new function object with the same name: it replaces the old one.
  def make():
    def my_len(prompts, completions, **cols):
      return [0.0] * len(completions)
    return my_len
  first, again = make(), make()
  register_reward("cell_reward")(first)
  register_reward("cell_reward")(again)
  assert get_reward("cell_reward") is again


def test_unknown_names_are_clear_errors():
  with pytest.raises(ValueError, match="unknown reward 'nope'.*exact_match"):
    get_reward("nope")
  with pytest.raises(ValueError, match="cannot import"):
    get_reward("grpo_jax.rewards.exact:nope")
  with pytest.raises(TypeError):
    get_reward(3)


def test_exact_match_strips_and_stringifies():
  out = exact_match(["p"] * 4, [" 12\n", "12", "1 2", ""], answer=[12, "12 ", 12, ""])
  assert out == [1.0, 1.0, 0.0, 1.0]
