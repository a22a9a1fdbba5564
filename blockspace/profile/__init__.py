"""``blockspace gpu-profile``: measure the simulator's step-time model on a
real GPU and write it as a file that ``blockspace simulate --step-model``
reads (``blockspace.simulator.step_model``).

    plan.py     what is measured: the model's shape and the steps to time (no torch)
    model.py    a Llama-shaped decoder stack with random weights, and its step
    measure.py  timing steps and block swaps with CUDA events, median of repeats
    fit.py      the five coefficients from the timings, by least squares (no torch)
    cli.py      the command: options, checks, the run, the file

Nothing in the managers or the simulator imports this package: torch is
needed here only, and only by ``model.py`` and ``measure.py``, which the
command imports once its options are checked and torch is known to be there.
"""
