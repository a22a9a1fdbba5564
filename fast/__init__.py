"""The fast block manager: NumPy state, Numba kernels, the reference's results."""

from blockspace.fast.manager import FastBlockSpaceManager

__all__ = ["FastBlockSpaceManager"]
