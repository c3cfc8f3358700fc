"""`grpo-train`, for a checkout without console commands (a Ray job's working directory)."""
from grpo_jax.commands.launch import train

if __name__ == "__main__":
  train()
