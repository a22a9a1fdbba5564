"""blockspace's managers inside vLLM 0.9's v0 ``Scheduler``, with no change to vLLM.

Why a plugin. vLLM calls every ``vllm.general_plugins`` entry point in each
process it starts (``load_general_plugins``), so a hook installed there is in
place wherever vLLM builds a scheduler. Two routes:

- ``BLOCKSPACE_MANAGER=fast`` (or ``reference``) in the environment:
  ``register``, the entry point, makes vLLM's
  ``BlockSpaceManager.get_block_space_manager_class("selfattn")`` answer our
  class. That static method is the one place where the v0 Scheduler picks its
  manager; wrapping it leaves every other version ("placeholder", for models
  without a KV cache) to vLLM, and leaves ``SelfAttnBlockSpaceManager`` itself
  alone for whoever imports it by name. Without the variable ``register``
  does nothing at all, not even import vLLM.
- ``--scheduler-cls blockspace.vllm_plugin.Scheduler`` (with ``VLLM_USE_V1=0``):
  vLLM's own v0 Scheduler, building the fast manager (or the one
  ``BLOCKSPACE_MANAGER`` names) for itself only.

Why it never raises. ``load_general_plugins`` does not catch what a plugin
raises, and a plugin runs in every vLLM process: an unknown variable value, a
vLLM we do not know, or a manager that fails to import is one error line,
logged once per process, and vLLM keeps its own manager. The one exception
is ``Scheduler`` on a vLLM that has no v0 Scheduler to hand back: there the
same line is raised as an ``ImportError``.

Nothing else in blockspace imports this module, and it imports vLLM only
when asked to act: vLLM is never a dependency of blockspace.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from blockspace.interfaces import load_manager_class

VARIABLE = "BLOCKSPACE_MANAGER"
MANAGERS = ("fast", "reference")
SUPPORTED = "0.9"  # the v0 interface our managers reproduce is vLLM 0.9.2's

# Under vLLM's logger, so the lines come out in vLLM's format, at VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.plugins.blockspace")


@functools.cache
def _log_once(level: int, message: str) -> None:
    """Each distinct line once per process: the plugin runs wherever vLLM starts one."""
    logger.log(level, message)


def _requested(default: str | None) -> str | None:
    """The manager ``BLOCKSPACE_MANAGER`` names, else ``default``; None for
    vLLM's own (no variable and no default, or a value we do not know)."""
    value = os.environ.get(VARIABLE, "").strip()
    if not value:
        return default
    if value.lower() in MANAGERS:
        return value.lower()
    _log_once(
        logging.ERROR,
        f"blockspace: {VARIABLE}={value!r} is not one of {', '.join(MANAGERS)}; vLLM's own block manager is used",
    )
    return None


def _refusal() -> str | None:
    """Why this vLLM cannot take our manager, or None: it must be 0.9.x and have its v0 core."""
    import vllm

    found = getattr(vllm, "__version__", "of unknown version")
    try:
        import vllm.core.interfaces  # noqa: F401
    except ImportError:
        reason = f"vLLM {found} has no v0 core (vllm.core.interfaces, gone since 0.11)"
    else:
        if found.split(".")[:2] == SUPPORTED.split("."):
            return None
        reason = f"vLLM {found} is a version blockspace does not know"
    return f"blockspace: {reason}; it plugs into vLLM {SUPPORTED}.x only (built against 0.9.2)"


@functools.cache
def _manager_class(name: str) -> type | None:
    """Our class, loaded when vLLM first asks for it (the processes that never
    build a scheduler, vLLM's workers, never import Numba's kernels)."""
    try:
        return load_manager_class(name)
    except Exception as error:  # whatever a broken install raises, vLLM must keep running
        _log_once(
            logging.ERROR,
            f"blockspace: cannot load the {name} manager ({type(error).__name__}: {error}); "
            "vLLM's own block manager is used",
        )
        return None


def _selfattn_answered_by(name: str, chooser: Callable[[str], type]) -> staticmethod:
    """vLLM's ``get_block_space_manager_class`` with "selfattn" answered by our ``name`` manager."""

    @functools.wraps(chooser)
    def get_block_space_manager_class(version: str) -> type:
        if version.lower() == "selfattn" and (cls := _manager_class(name)) is not None:
            return cls
        return chooser(version)

    return staticmethod(get_block_space_manager_class)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: with ``BLOCKSPACE_MANAGER``
    set, every v0 Scheduler this process builds holds our manager."""
    name = _requested(default=None)
    if name is None:
        return
    if (refusal := _refusal()) is not None:
        _log_once(logging.ERROR, f"{refusal}, so vLLM's own block manager is used")
        return
    from vllm.core.interfaces import BlockSpaceManager

    BlockSpaceManager.get_block_space_manager_class = _selfattn_answered_by(
        name, BlockSpaceManager.get_block_space_manager_class
    )
    _log_once(
        logging.INFO, f"blockspace: vLLM's v0 Scheduler builds blockspace's {name} block manager ({VARIABLE}={name})"
    )


@contextmanager
def _building_with(name: str) -> Iterator[None]:
    """vLLM's chooser answers our ``name`` manager while a Scheduler is built, and only then."""
    from vllm.core.interfaces import BlockSpaceManager

    saved = BlockSpaceManager.__dict__["get_block_space_manager_class"]
    BlockSpaceManager.get_block_space_manager_class = _selfattn_answered_by(name, saved.__func__)
    try:
        yield
    finally:
        BlockSpaceManager.get_block_space_manager_class = saved


@functools.cache
def _scheduler_class() -> type:
    """``Scheduler``: made once, on first use, so that importing this module
    (vLLM does, in every process) imports no vLLM."""
    refusal = _refusal()
    if refusal is not None:
        try:
            from vllm.core.scheduler import Scheduler as VllmScheduler
        except ImportError:
            message = f"{refusal}, and this vLLM has no v0 Scheduler to hand back"
            _log_once(logging.ERROR, message)
            raise ImportError(message) from None
        _log_once(logging.ERROR, f"{refusal}, so vLLM's own block manager is used")
        return VllmScheduler

    from vllm.core.scheduler import Scheduler as VllmScheduler

    class Scheduler(VllmScheduler):
        """vLLM's v0 Scheduler holding blockspace's fast manager, or the one
        ``BLOCKSPACE_MANAGER`` names (read at each construction)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            name = _requested(default="fast")
            with nullcontext() if name is None else _building_with(name):
                super().__init__(*args, **kwargs)

    Scheduler.__qualname__ = "Scheduler"  # where pickle finds it: this module's __getattr__
    return Scheduler


def __getattr__(name: str) -> Any:
    if name == "Scheduler":
        return _scheduler_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
