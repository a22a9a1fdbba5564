"""The explorer, sweeps and searches on a running Ray cluster
(``--executor ray --address``; ``conformance/ray_layers.py``,
``simulator/executor.py``): the process pool's answers.

The cluster is started as a user starts one, ``ray start --head``, on 2
CPUs, with a temporary folder of this module's own (short: Ray's socket
paths have a length limit), and stopped after, leaving no Ray process and
no folder. The commands run in their own processes, each a Ray driver
that joins the cluster at its address. Skipped where Ray (the [ray] extra)
is not installed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import processes

pytest.importorskip("ray", reason="Ray is the [ray] extra: pip install 'blockspace[ray]'")

RAY = str(Path(sys.executable).parent / "ray")
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}  # no token written under ~/.ray, no report
TIMED = ("wall_s", "manager_startup_s", "manager_time")  # what differs between any two runs, pool or not


def cluster_processes(folder: str) -> set[int]:
    """The processes of the cluster of ``folder``: those that name it (its
    GCS, raylet and agents) and their descendants (its workers)."""
    rows = processes()
    found = {pid for pid, _, args in rows if folder in args}
    while more := {pid for pid, ppid, _ in rows if ppid in found} - found:
        found |= more
    return found


def stop(folder: str) -> None:
    """Ends the cluster of ``folder``, and it alone. Why not ``ray stop``:
    it ends every Ray process of the machine, a user's own clusters and
    this test run's local one too (started in this process by the option
    grids' probes, whose driver, pytest itself, then exits a minute later
    when it finds its cluster gone)."""
    for sent in (signal.SIGTERM, signal.SIGKILL):
        for pid in cluster_processes(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sent)
        deadline = time.monotonic() + 10
        while cluster_processes(folder) and time.monotonic() < deadline:
            time.sleep(0.1)


@contextlib.contextmanager
def a_cluster():
    """A 2-CPU Ray cluster, started as a user starts one: its address, the
    environment to join it with, and its folder; stopped after, leaving no
    process and no folder."""
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {**os.environ, **QUIET}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_TMPDIR", None)  # it would win over --temp-dir: the cluster's folder is this one
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", f"--temp-dir={folder}",
                        "--include-dashboard=false", "--disable-usage-stats"], env=env, check=True,
                       capture_output=True, timeout=180)  # fmt: skip
        yield f"127.0.0.1:{port}", env, folder
    finally:
        stop(folder)
        shutil.rmtree(folder, ignore_errors=True)
        assert cluster_processes(folder) == set() and not Path(folder).exists()


@pytest.fixture(scope="module")
def cluster():
    """This module's cluster (``a_cluster``)."""
    with a_cluster() as made:
        yield made


def test_a_cluster_of_the_tests_stops_alone():
    """Stopping a cluster of the tests leaves every other Ray cluster of the
    machine running: a user's, or this test run's local one (``ray stop``
    ended them all, and pytest with its own a minute later)."""
    with a_cluster() as (_, _, other):
        named = lambda: {pid for pid, _, args in processes() if other in args}  # noqa: E731 - its GCS, raylet, agents
        running = named()
        with a_cluster() as (_, _, mine):
            assert cluster_processes(mine)
        assert running and named() == running


def actors(folder: str) -> list[str]:
    """The actors alive on the cluster of ``folder``: its raylet's worker
    processes that hold one."""
    rows = processes()
    raylets = {pid for pid, _, args in rows if "raylet" in args and folder in args}
    return [args for _, ppid, args in rows if ppid in raylets and args.startswith("ray::LayerWorker")]


def simulate(env: dict[str, str], out: Path, *argv: str) -> None:
    """``blockspace simulate`` on the bundled sample, in a process of its own."""
    command = [sys.executable, "-m", "blockspace", "simulate", "--manager", "reference", "--max-requests", "30",
               "--workers", "2", "--no-plot", "--quiet", "--out", str(out), *argv]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def untimed(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key not in TIMED}


def test_a_sweep_on_a_running_cluster_gives_the_pools_figures(cluster, tmp_path):
    address, env, _ = cluster
    sweep = ("--sweep", "block_size=16,32", "--sweep", "max_num_seqs=4,64")
    simulate(env, tmp_path / "ray", *sweep, "--executor", "ray", "--address", address)
    simulate(env, tmp_path / "pool", *sweep)
    on_ray, in_pool = (json.loads((tmp_path / kind / "sweep.json").read_text())["runs"] for kind in ("ray", "pool"))
    assert len(on_ray) == 4
    assert [(run["values"], untimed(run["summary"])) for run in on_ray] == [
        (run["values"], untimed(run["summary"])) for run in in_pool
    ]


def test_a_search_on_a_running_cluster_gives_the_pools_answer(cluster, tmp_path):
    address, env, _ = cluster
    search = ("--find", "min-replicas", "--router", "kv_aware", "--time-scale", "0.2", "--slo", "ttft=5s")
    simulate(env, tmp_path / "ray", *search, "--executor", "ray", "--address", address)
    simulate(env, tmp_path / "pool", *search)
    (on_ray,), (in_pool,) = (json.loads((tmp_path / kind / "capacity.json").read_text())["configurations"]
                             for kind in ("ray", "pool"))  # fmt: skip
    assert on_ray["min_replicas"] == in_pool["min_replicas"] is not None
    assert on_ray["curve"] == in_pool["curve"] and len(on_ray["curve"]) > 2


def conformance(env: dict[str, str], report: Path, *argv: str, cwd: Path | None = None) -> list[dict]:
    """``blockspace conformance``'s explorer alone, in a process of its own: its checks from ``--json``."""
    command = [sys.executable, "-m", "blockspace", "conformance", "--profile", "exhaustive", "--only", "explore",
               "--workers", "2", "--json", str(report), *argv]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-2000:]
    return json.loads(report.read_text())["checks"]


def proved(check: dict) -> tuple:
    """What a search proved, less its times: the figures, the situations and the theorem's words."""
    figures = ("status", "states", "transitions", "calls", "depth", "layers", "exhausted", "situations")
    theorem, detail = (re.sub(r"[\d.,]+ s on \d+ worker\(s\), [\d,]+ transitions/s", "T", check[key])
                       for key in ("theorem", "detail"))  # fmt: skip
    return theorem, detail, *(check[key] for key in figures)


def test_the_explorer_on_a_running_cluster_proves_what_the_pool_proves(cluster, tmp_path):
    address, env, _ = cluster
    scopes = ("--impl", "fast", "--scope", "plain_single", "--scope", "swap_single")
    on_ray = conformance(env, tmp_path / "ray.json", *scopes, "--executor", "ray", "--address", address)
    in_pool = conformance(env, tmp_path / "pool.json", *scopes)
    assert [check["status"] for check in on_ray] == ["passed", "passed"]
    assert [proved(check) for check in on_ray] == [proved(check) for check in in_pool]
    assert on_ray[0]["states"] == 598 and on_ray[0]["exhausted"] and on_ray[0]["workers"] == 2


def test_a_users_broken_manager_from_a_file_fails_on_the_cluster_with_the_pools_repro(cluster, tmp_path):
    """The manager's module is a file on the command's ``PYTHONPATH``,
    which the cluster's workers (started before, by ``ray start``) do not
    have: they import it only as shipped with the job. The first
    counterexample is the pool's, repro and all."""
    address, env, _ = cluster
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "users_manager.py").write_text(
        "from blockspace.conformance.broken import FifoFreeList\n\n\nclass Mine(FifoFreeList):\n    pass\n"
    )
    env = {**env, "PYTHONPATH": str(tmp_path / "mine")}  # the command's own path: the cluster's workers lack it
    argv = ("--impl", "users_manager:Mine", "--scope", "plain", "--scope-set", "max_depth=4")
    on_ray = conformance(env, tmp_path / "ray.json", *argv, "--executor", "ray", "--address", address)
    in_pool = conformance(env, tmp_path / "pool.json", *argv)
    assert proved(on_ray[0]) == proved(in_pool[0]) and on_ray[0]["status"] == "failed"
    assert on_ray[0]["failure_moves"] == 3 and "users_manager:Mine" in on_ray[0]["detail"]


def test_ctrl_c_ends_a_run_on_the_cluster_within_5_s_with_its_workers_killed(cluster, tmp_path):
    """SIGINT to the command's process group, as a terminal sends it, while
    the cluster's workers expand a layer: exit 130 within 5 s, one line,
    no report, and no worker of the run left on the cluster."""
    address, env, folder = cluster
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "blockspace", "conformance", "--impl", "fast", "--profile", "exhaustive",
               "--only", "explore", "--scope", "plain", "--workers", "2", "--executor", "ray", "--address", address,
               "--json", str(report)]  # fmt: skip
    heard = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731 - as a terminal's command hears it
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=heard)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(".expand" in args for args in actors(folder)):  # a chunk is being expanded
            assert process.poll() is None and time.monotonic() < deadline, (
                process.stderr.read() if process.stderr else ""
            )
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)
        sent = time.monotonic()
        _, err = process.communicate(timeout=30)
        seconds = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130 and seconds < 5, (process.returncode, seconds, err)
    assert err.splitlines() == ["interrupted: stopped by Ctrl-C"] and not report.exists()
    deadline = time.monotonic() + 10
    while actors(folder) and time.monotonic() < deadline:  # killed: their processes end
        time.sleep(0.1)
    assert actors(folder) == []
