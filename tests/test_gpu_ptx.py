"""The CUDA kernels compile for Hopper (sm_90), without a GPU.

Numba needs NVVM and NVRTC for this (the GPU machine has them; elsewhere
``pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12``); without them
the test is skipped. It catches what the simulator cannot: a kernel that
does not type or lower for the real target, like the address loads and stores.
"""

from __future__ import annotations

import pytest
from numba import config, cuda
from numba import types as nb

import blockspace.fast.device_table  # noqa: F401,E402  (first: its NumPy 2.5 fix for numba-cuda's compiler)

pytestmark = pytest.mark.skipif(bool(config.ENABLE_CUDASIM), reason="the simulator compiles nothing")


def _toolchain_missing() -> str | None:
    try:
        cuda.compile_ptx(lambda a: None, (nb.int64[::1],), cc=(9, 0))
    except Exception as error:  # no libnvvm / libnvrtc here
        return f"no CUDA compiler toolchain: {type(error).__name__}"
    return None


def test_kernels_compile_for_sm90():
    missing = _toolchain_missing()
    if missing:
        pytest.skip(missing)
    from blockspace.fast.device_table import _step_kernel
    from blockspace.fast.kv_copy import move_kernel

    ptx, _ = cuda.compile_ptx(
        _step_kernel.py_func,
        (nb.int32[:, ::1], nb.int32[::1], nb.int32[::1], nb.int64, nb.int64[::1]),
        cc=(9, 0),
    )
    assert ".target sm_90" in ptx and "bar.sync" in ptx
    for word_bytes in (8, 4, 2, 1):
        ptx, _ = cuda.compile_ptx(
            move_kernel(word_bytes).py_func, (nb.int64[:, ::1], nb.int64[::1], nb.int64, nb.int64), cc=(9, 0)
        )
        bits = 8 * word_bytes
        assert f"ld.u{bits}" in ptx and f"st.u{bits}" in ptx  # the address loads and stores, at the word width
