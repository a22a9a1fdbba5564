"""The compiled engine: the simulator's step as Numba code calling fast's
kernels, the fast twin of the Python engine (``scheduler.py`` and
``simulation.py``). ``engine.py`` is where to start reading."""

from blockspace.numba_cache import install

install()  # before any function here is decorated (numba_cache.py)
