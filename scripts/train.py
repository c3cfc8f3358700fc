"""`grpo-train`, for a checkout without console commands (a Ray job's working directory)."""
from grpo_jax.commands.train import main

if __name__ == "__main__":
  main()
