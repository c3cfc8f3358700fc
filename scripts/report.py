"""`grpo-report`, for a checkout without console commands (a Ray job's working directory)."""
from grpo_jax.commands.report import main

if __name__ == "__main__":
  main()
