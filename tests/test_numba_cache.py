"""The compiled parts' cache is stamped with all their files (blockspace/numba_cache.py):
a cached caller whose callee lives in another file is compiled afresh when
that file changes, not loaded with the callee's old code linked in."""

from __future__ import annotations

import os
import time

import pytest

from blockspace import numba_cache


def test_the_joint_stamp_moves_with_any_file(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    (first / "pool.py").write_text("x = 1\n")
    (second / "loop.py").write_text("y = 2\n")
    before = numba_cache.joint_stamp((first, second))
    assert numba_cache.joint_stamp((first, second)) == before
    later = time.time() + 5
    os.utime(first / "pool.py", (later, later))  # only the callee's file changes
    assert numba_cache.joint_stamp((first, second)) != before
    (second / "new.py").write_text("")
    assert numba_cache.joint_stamp((first, second)) != numba_cache.joint_stamp((first,))
    rule = tmp_path / "budget.py"  # a single file, as the rule the compiled engine compiles from the Python one's
    rule.write_text("z = 3\n")
    with_rule = numba_cache.joint_stamp((first, rule))
    os.utime(rule, (later + 5, later + 5))
    assert numba_cache.joint_stamp((first, rule)) != with_rule
    assert any(root.name == "budget.py" and root.is_file() for root in numba_cache.ROOTS)


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="nothing is cached without the JIT")
def test_every_cached_function_of_the_compiled_parts_takes_the_joint_stamp():
    from blockspace.fast import pool, table
    from blockspace.simulator.compiled import loop

    stamp = numba_cache.joint_stamp()
    for function in (pool.take, table.allocate, loop.run):
        locator = function._cache._impl.locator
        assert type(locator).__name__ == "JointStampLocator", function
        assert locator.get_source_stamp()[1] == stamp
    numba_cache.install()  # a second install changes nothing
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    assert sum(getattr(c, "JOINT", False) for c in impl._locator_classes) == 1
