from grpo_jax.data.datasets import DatasetError, load_rows, load_train_heldout, split_rows
from grpo_jax.data.templates import R1_SYSTEM_PROMPT, R1_ZERO_TEMPLATE, render_prompt, tokenize_prompts
