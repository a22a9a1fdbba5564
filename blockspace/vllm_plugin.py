"""blockspace's managers inside vLLM 0.9's v0 ``Scheduler``, with no change to vLLM.

Why a plugin. vLLM calls every ``vllm.general_plugins`` entry point
(``load_general_plugins``) in each process it starts: when it reads its
engine arguments (``EngineArgs``, behind ``LLM(...)``, ``vllm serve`` and
``LLMEngine.from_engine_args``) and in its workers. So a hook installed
there is in place wherever vLLM's engine builds a scheduler. Three routes:

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
- ``install("fast")`` (or ``"reference"``), called in code: what ``register``
  does, with the manager named in the call instead of the variable.

A Scheduler built by hand. ``Scheduler(scheduler_config, cache_config,
lora_config)`` built straight from vLLM's configs, as a test or a benchmark
does, goes through no ``EngineArgs``, so vLLM's loader never runs and
``BLOCKSPACE_MANAGER`` alone does not reach it: it holds vLLM's own manager,
and nothing says so. Reach it in one of three ways, before building it:
call ``blockspace.vllm_plugin.install("fast")``; or call
``vllm.plugins.load_general_plugins()`` with the variable set, as vLLM's
engine does; or build ``blockspace.vllm_plugin.Scheduler`` instead of vLLM's.

Why the plugin never raises. ``load_general_plugins`` does not catch what a
plugin raises, and a plugin runs in every vLLM process: an unknown variable
value, a vLLM we do not know, or a manager that fails to import is one error
line, logged once per process, and vLLM keeps its own manager. Two calls
raise instead, because code asked for them by name: ``install`` (a wrong
name, a vLLM we do not know, a manager that fails to import), and
``Scheduler`` on a vLLM that has no v0 Scheduler to hand back (there the
same line is raised as an ``ImportError``).

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

from blockspace.errors import InvalidArgumentError
from blockspace.interfaces import load_manager_class

VARIABLE = "BLOCKSPACE_MANAGER"
MANAGERS = ("fast", "reference")
SUPPORTED = "0.9"  # the v0 interface our managers reproduce is vLLM 0.9.2's
# The static method of vLLM's BlockSpaceManager that we replace. It is set with setattr and this
# name: mypy, which reads vLLM's own class where vLLM is installed, refuses an assignment to a method.
CHOOSER = "get_block_space_manager_class"

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


def _answer_selfattn_with(name: str) -> None:
    """From now on in this process, vLLM's chooser answers "selfattn" with our ``name`` manager."""
    from vllm.core.interfaces import BlockSpaceManager

    setattr(BlockSpaceManager, CHOOSER, _selfattn_answered_by(name, BlockSpaceManager.get_block_space_manager_class))


def register() -> None:
    """The ``vllm.general_plugins`` entry point: with ``BLOCKSPACE_MANAGER``
    set, every v0 Scheduler this process builds once vLLM's loader has run
    holds our manager."""
    name = _requested(default=None)
    if name is None:
        return
    if (refusal := _refusal()) is not None:
        _log_once(logging.ERROR, f"{refusal}, so vLLM's own block manager is used")
        return
    _answer_selfattn_with(name)
    _log_once(
        logging.INFO, f"blockspace: vLLM's v0 Scheduler builds blockspace's {name} block manager ({VARIABLE}={name})"
    )


def install(name: str = "fast") -> None:
    """Make every v0 Scheduler this process builds from now on hold our
    ``name`` manager ("fast" or "reference"), with no variable and no plugin loader.

    Why: vLLM runs ``register`` only when its engine starts; a Scheduler
    built by hand from vLLM's configs comes after no such start, and would
    keep vLLM's own manager. Call this before building it. Unlike the
    plugin, it raises rather than falls back to vLLM's manager, since the
    caller asked for ours in code: ``InvalidArgumentError`` for a name that
    is not one of ``MANAGERS``, ``ImportError`` for a vLLM other than 0.9.x
    (or none), and whatever loading the manager raises. Called again, the
    last name wins.
    """
    if name not in MANAGERS:
        raise InvalidArgumentError(f"vllm_plugin.install: {name!r} is not one of {', '.join(MANAGERS)}")
    if (refusal := _refusal()) is not None:
        raise ImportError(refusal)
    load_manager_class(name)  # a broken install raises here, not as a log line at the first Scheduler
    _answer_selfattn_with(name)
    _log_once(logging.INFO, f"blockspace: vLLM's v0 Scheduler builds blockspace's {name} block manager (install)")


@contextmanager
def _building_with(name: str) -> Iterator[None]:
    """vLLM's chooser answers our ``name`` manager while a Scheduler is built, and only then."""
    from vllm.core.interfaces import BlockSpaceManager

    saved = BlockSpaceManager.__dict__[CHOOSER]
    setattr(BlockSpaceManager, CHOOSER, _selfattn_answered_by(name, saved.__func__))
    try:
        yield
    finally:
        setattr(BlockSpaceManager, CHOOSER, saved)


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
