"""Joining a Ray cluster (``--executor ray``, the ``[ray]`` extra): the
kit's explorer (``conformance/ray_layers.py``) and the simulator's sweeps
and searches (``simulator/executor.py``) run their work there.

Which cluster: the one this process already joined, else the one at
``--address`` (``RAY_ADDRESS``), else a local one Ray starts on this
machine's cores. The processes a local cluster starts are made with
SIGINT held back (``interrupts.sigint_held``: the mask is inherited
through fork and exec), so a Ctrl-C in the terminal reaches the command
alone, which then ends its work on the cluster itself.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from blockspace.errors import InvalidArgumentError
from blockspace.extras import missing_extra
from blockspace.interrupts import sigint_held

WHAT = "--executor ray"
CONNECT_S = 5.0  # how long an --address may take to answer


def ray_module() -> Any:
    """The ``ray`` module (``MissingExtraError`` naming the [ray] extra without it)."""
    try:
        import ray
    except ImportError:
        raise missing_extra("ray", WHAT, ["ray"]) from None
    return ray


def use_address(address: str | None) -> None:
    """Work goes to the cluster at ``address`` (``host:port``, or ``auto``)
    where one is given: by ``RAY_ADDRESS``, which Ray reads when this
    process first joins a cluster. Checks Ray is installed and the address
    answers first: a refused address leaves the environment as it was (a
    command run in a process that goes on, as the tests run them)."""
    ray_module()
    if address is not None:
        reachable(address)
        os.environ["RAY_ADDRESS"] = address


def join(py_modules: tuple[str, ...] = ()) -> Any:
    """This process joined to its cluster (module docstring); the ``ray``
    module. ``py_modules``: files or folders of modules every worker must
    import that the nodes may lack, uploaded with the job (Ray takes local
    paths only for a whole job, when it is joined: a later join with other
    modules changes nothing)."""
    ray = ray_module()
    address = os.environ.get("RAY_ADDRESS")
    reachable(address)  # even when joined already: an address that cannot be joined is a mistake to say
    if not ray.is_initialized():
        own: dict[str, Any] = {} if address else {"include_dashboard": False}  # a local cluster's own options
        if py_modules:
            own["runtime_env"] = {"py_modules": list(py_modules)}
        try:
            with sigint_held():
                ray.init(log_to_driver=False, logging_level=logging.WARNING, **own)
        except (ConnectionError, RuntimeError, ValueError) as error:  # no cluster there, or not Ray's
            where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
            raise InvalidArgumentError(f"--executor ray: cannot join {where}: {error}") from None
    return ray


def reachable(address: str | None) -> None:
    """``InvalidArgumentError`` at once where nothing listens at ``address``
    (``host:port``): Ray itself would wait for it for many minutes.
    ``auto`` and ``local`` are Ray's to find."""
    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as error:
        raise InvalidArgumentError(
            f"--address {address}: no Ray cluster to join, nothing answers there ({error})"
        ) from None


def cpus() -> int:
    """The CPUs of the cluster this process joined (``join``)."""
    return max(1, int(join().cluster_resources().get("CPU", 1)))


__all__ = ["cpus", "join", "ray_module", "use_address"]
