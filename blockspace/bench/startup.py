"""Start-up in fresh processes (import plus the first calls, with a cold and
a warm Numba cache), and the machine the figures were taken on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STARTUP = """
import time
start = time.perf_counter()
from blockspace.fast import FastBlockSpaceManager
from blockspace import SequenceGroup, SequenceStatus
imported = time.perf_counter()
m = FastBlockSpaceManager(16, 1000, 100, enable_caching=True)
g = SequenceGroup.from_prompt("a", list(range(100)), first_seq_id=0)
m.get_num_cached_tokens(g.seqs[0])
m.can_allocate(g)
m.allocate(g)
first = time.perf_counter()
s = g.seqs[0]
s.status = SequenceStatus.RUNNING
s.append_token_id(5)
m.can_append_slots(g, 0)
m.append_slots(s, 0)
m.free(s)
done = time.perf_counter()
print(imported - start, first - start, done - start)
"""


def startup(quick: bool) -> dict[str, Any]:
    """Seconds for import, import + first allocate, and import + a whole request, in fresh processes."""

    def measure(cache_dir: str) -> list[float]:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        out = subprocess.run([sys.executable, "-c", STARTUP], env=env, capture_output=True, text=True, check=True)
        return [float(x) for x in out.stdout.split()]

    keys = ("import_s", "import_and_first_call_s", "import_and_first_request_s")
    with tempfile.TemporaryDirectory() as cache_dir:
        cold = measure(cache_dir)
        warm = min((measure(cache_dir) for _ in range(2 if quick else 5)), key=lambda t: t[1])
    return {"cold": dict(zip(keys, cold)), "warm": dict(zip(keys, warm))}


def machine() -> dict[str, Any]:
    import numba
    import numpy

    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "load_average": os.getloadavg(),
    }
