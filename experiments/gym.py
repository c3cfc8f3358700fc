# pip install -e '.[gym]'; bash scripts/get_smollm2.sh    # once: reasoning-gym, models/SmolLM2-135M-Instruct
# python scripts/train.py --config experiments/gym.py:basic_arithmetic --workdir runs/gym_basic_arithmetic
# python scripts/evaluate.py --config experiments/gym.py:aiw_4 --size 500   # the starting accuracy
# python scripts/sweep.py --config experiments/gym.py --sweep_dir runs/gym            # every task x 3 seeds
#   (preset experiments/gym.py:test: the tiny fixture checkpoint, 2 steps, for CI)
"""SmolLM2-135M-Instruct on reasoning-gym tasks (grpo_jax/data/reasoning_gym.py), one preset per task.

Presets (TASKS): three datasets of three reasoning-gym families (arithmetic, algebra, logic) on which the model
starts low but not at zero (held-out greedy full credit 14.3%, 12.3%, 6.8%; pass@8 18-20% on the latter two) and
whose most frequent answer holds 11-28% of the items (where one answer held a third or more, the policy collapsed
to it); CANDIDATES: the
others tried, among them the first choices simple_equations (`+` and `-`) and aiw (defaults), which start at 4.3% and
4.4% (docs/gym.md has every number and command). The task runs in answer-only mode (`task.answer_only`): the question
goes to the model's chat template after ANSWER_ONLY_SYSTEM_PROMPT, the assistant turn is prefilled with "<answer>",
sampling stops where the model closes the tag, and the reward is the dataset's own verifier's full credit
(`reasoning_gym_full_credit`: 1 when it scores the answer 1, else 0) on the first sentence of the first non-empty
line, the right-hand side of its last "=" if it has one (docs/gym.md). With reasoning-gym's tag convention the 135M
model starts at 0-2% everywhere: it does not write the tags. Training items come from seed 1, held-out ones from
seed 1,000,000 (held-out questions also asked in training dropped and counted).

The config is experiments/smollm2_arithmetic.py's (beta 0, 8 prompts x G 8, T 0.8, AdamW lr 1e-5, float32) with
the task, its reward, 24 new tokens (an answer, not a worked solution), 100 steps and DAPO's dynamic sampling
(`grpo.dynamic_sampling`: the model starts low, so most groups' rewards are all equal; only the others are
trained on, up to 4 sampler calls a step) set below.
"""
from grpo_jax import config as config_lib
from grpo_jax.sweep import spec
from grpo_jax.data.reasoning_gym import ANSWER_ONLY_SYSTEM_PROMPT

# preset -> (task name, dataset options): the sweep's tasks, three families.
TASKS = {
    "basic_arithmetic": ("reasoning_gym:basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                            "max_digits": 1}),
    "simple_equations_minus": ("reasoning_gym:simple_equations", {
        "min_terms": 2, "max_terms": 2, "max_value": 10, "operators": ["-"], "operators_weights": [1.0]}),
    "aiw_4": ("reasoning_gym:aiw", {"max_entities": 4}),
}
# Further presets tried for the starting band (docs/gym.md has their numbers); not in the sweep.
CANDIDATES = {"simple_equations": ("reasoning_gym:simple_equations", {
                  "min_terms": 2, "max_terms": 2, "max_value": 10, "operators": ["+", "-"],
                  "operators_weights": [0.5, 0.5]}),
              "aiw": ("reasoning_gym:aiw", {}),
              "simple_equations_plus": ("reasoning_gym:simple_equations", {
                  "min_terms": 2, "max_terms": 2, "max_value": 10, "operators": ["+"], "operators_weights": [1.0]}),
              "simple_equations_plus20": ("reasoning_gym:simple_equations", {
                  "min_terms": 2, "max_terms": 2, "max_value": 20, "operators": ["+"], "operators_weights": [1.0]}),
              "aiw_5": ("reasoning_gym:aiw", {"max_entities": 5}),
              "leg_counting": ("reasoning_gym:leg_counting", {"min_animals": 1, "max_animals": 2}),
              "letter_counting": ("reasoning_gym:letter_counting", {}),
              "word_sorting_3": ("reasoning_gym:word_sorting", {"min_words": 3, "max_words": 3}),
              "number_sorting_3": ("reasoning_gym:number_sorting", {
                  "min_numbers": 3, "max_numbers": 3, "max_decimals": 0, "min_value": 0, "max_value": 99}),
              "number_sequence_easy": ("reasoning_gym:number_sequence", {
                  "min_terms": 4, "max_terms": 5, "max_complexity": 1}),
              "spell_backward_short": ("reasoning_gym:spell_backward", {"min_word_len": 3, "max_word_len": 4}),
              "letter_jumble_1": ("reasoning_gym:letter_jumble", {
                  "min_word_len": 3, "max_word_len": 5, "min_words": 1, "max_words": 1,
                  "min_corruption_level": 0.1, "max_corruption_level": 0.3}),
              **{name: (f"reasoning_gym:{name}", {}) for name in (
                  "syllogism", "isomorphic_strings", "gcd", "course_schedule", "spell_backward", "coin_flip",
                  "number_sequence", "rectangle_count", "propositional_logic", "color_cube_rotation", "largest_island",
                  "count_primes", "family_relationships", "needle_haystack", "self_reference",
                  "simple_geometry", "products", "count_bits")}}
SEEDS = (0, 1, 2)


def get_config(preset: str | None = None):
  presets = {**TASKS, **CANDIDATES}
  task = preset if preset in presets else "basic_arithmetic"
  c = spec.sibling_experiment(__file__, "smollm2_arithmetic.py").get_config()
  c.num_steps = 100
  c.grpo.dynamic_sampling = True  # DAPO's: only groups with unequal rewards reach the update (docs/gym.md)

  c.task.name, options = presets[task]
  c.task.options = options
  c.task.train_size = 5000
  c.task.train_seed = 1
  c.task.heldout_size = 500
  c.task.heldout_seed = 1_000_000
  c.task.system_prompt = ANSWER_ONLY_SYSTEM_PROMPT
  c.task.answer_only = True   # the prompt ends in "<answer>"; the completion stops at "</"
  # The word_arithmetic keys of the base experiment, which a reasoning_gym task does not read (left at their
  # defaults: a key the task does not read is refused when set).
  base = config_lib.get_config().task
  c.task.transfer, c.task.num_digits, c.task.heldout_fraction = "", base.num_digits, base.heldout_fraction

  # The verifier's full credit only: its partial credit for a line that contains the answer is exploitable.
  c.rewards = {"reasoning_gym_full_credit": 1.0}
  c.eval.accuracy_reward = "reasoning_gym_full_credit"
  c.sampling.max_prompt_length = 320
  c.sampling.max_new_tokens = 24

  c.eval.every = 25
  c.checkpoint.every = 25
  c.log.samples_every = 25

  if preset == "test":
    from grpo_jax import testing
    testing.apply_test_preset(c, None)
    c.task.train_size, c.task.heldout_size = 64, 16
    c.grpo.micro_batch_size = 2
  elif preset not in (None, "") and preset not in presets:
    raise ValueError(f"experiments/gym.py: unknown preset {preset!r} (known: {', '.join(presets)}, test)")
  return c


def get_sweep():
  """Every task x SEEDS: `python scripts/report.py runs/gym` adds a table with one column per task."""
  # task.options as a Python dict literal: the trainer's command line parses it into the ConfigDict.
  # Seed-major: a sweep stopped early has every task at some seeds.
  return spec.order_by_seed(spec.grid(spec.variants({preset: {"task.name": name, "task.options": repr(options)}
                                                     for preset, (name, options) in TASKS.items()}), seeds=SEEDS))
