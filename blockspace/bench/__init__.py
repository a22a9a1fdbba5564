"""The benchmarks: ``blockspace bench`` (reference against fast) and
``blockspace gpu-bench`` (the CUDA kernels against vLLM v0's way).

    cli.py       ``blockspace bench``: runs the parts below, prints and writes the report
    timing.py    best of several runs; a wrapper that clocks every manager call
    methods.py   per-method latency on a running manager
    replay.py    the Mooncake replay through a small v0-style scheduler
    floor.py     the least work any manager must do on that replay
    batched.py   one decode step, per-sequence against batched and array-level
    startup.py   import and first calls in fresh processes; the machine
    report.py    the Markdown report (docs/performance.md)
    gpu.py       ``blockspace gpu-bench``

A tool, not part of the interface: neither the managers nor the conformance
kit import it.
"""
