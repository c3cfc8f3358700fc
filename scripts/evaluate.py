"""`grpo-evaluate`, for a checkout without console commands (a Ray job's working directory)."""
from grpo_jax.commands.launch import evaluate

if __name__ == "__main__":
  evaluate()
