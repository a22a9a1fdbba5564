"""The fast block manager: NumPy state, Numba kernels, the reference's results."""

from blockspace.numba_cache import install

install()  # before any kernel is decorated: cached kernels stamped with all their files (numba_cache.py)

from blockspace.fast.manager import FastBlockSpaceManager  # noqa: E402

__all__ = ["FastBlockSpaceManager"]
