"""The commands users install (setup.cfg's console_scripts), each a module with a `main()`:

  grpo-train     train.py      trains an experiment into a workdir (resumes one)
  grpo-sweep     sweep.py      runs an experiment file's sweep, locally or on a Ray cluster
  grpo-evaluate  evaluate.py   evaluates a run's checkpoint or an experiment's starting model
  grpo-report    report.py     tables and curves of a sweep directory
  grpo-export    export.py     a run's policy as a Hugging Face directory
  grpo-plot      plot.py       training curves of one run or several

memory_estimate.py is run as `python -m grpo_jax.commands.memory_estimate`. `python -m grpo_jax.commands.X` and
`python scripts/X.py` (what a Ray job's uploaded working directory runs) are the same commands.
"""
