"""blockspace.vllm_plugin: vLLM 0.9.2, unchanged, builds our manager.

Through vLLM's own plugin loader (``vllm.plugins.load_general_plugins``, which
finds the ``vllm.general_plugins`` entry point of the installed blockspace)
and vLLM's own v0 ``Scheduler`` built from vLLM's own configs; through
``--scheduler-cls blockspace.vllm_plugin.Scheduler``; and through
``vllm_plugin.install``, for a Scheduler built by hand (no loader runs).

Needs vLLM 0.9.2 with blockspace installed beside it (a venv set up by hand,
see docs/performance.md; the install registers the entry point); skipped elsewhere.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys

import pytest

NEEDS = "needs vLLM 0.9.2 (a venv set up by hand, see docs/performance.md)"
vllm = pytest.importorskip("vllm", reason=NEEDS)
if getattr(vllm, "__version__", None) != "0.9.2":
    pytest.skip(f"{NEEDS}; this is vLLM {getattr(vllm, '__version__', '?')}", allow_module_level=True)
pytest.importorskip("vllm.core.scheduler", reason=NEEDS)  # not a stand-in package holding only vllm/core

import vllm.plugins  # noqa: E402
from test_vllm_scheduler_bench import bench  # noqa: E402  (the script, loaded once by its own tests)
from vllm.core.block_manager import SelfAttnBlockSpaceManager  # noqa: E402
from vllm.core.interfaces import BlockSpaceManager  # noqa: E402
from vllm.core.placeholder_block_space_manager import PlaceholderBlockSpaceManager  # noqa: E402
from vllm.core.scheduler import Scheduler as VllmScheduler  # noqa: E402
from vllm.utils import resolve_obj_by_qualname  # noqa: E402

from blockspace import vllm_plugin  # noqa: E402
from blockspace.errors import InvalidArgumentError  # noqa: E402
from blockspace.fast import FastBlockSpaceManager  # noqa: E402
from blockspace.reference import ReferenceBlockSpaceManager  # noqa: E402
from blockspace.workloads import load_trace  # noqa: E402

OURS = {"fast": FastBlockSpaceManager, "reference": ReferenceBlockSpaceManager}
CHOOSER = "get_block_space_manager_class"
VLLMS_CHOOSER = BlockSpaceManager.__dict__[CHOOSER]  # before any plugin ran in this process
REPLAY = 100  # Mooncake requests of the bundled sample
# A smaller GPU than the script's default: vLLM's manager makes a Python object per block.
SETTINGS = ["--num-gpu-blocks", "8192"]


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch, caplog):
    """Each test as a new vLLM process: plugins not yet loaded, vLLM's chooser
    its own, no variable set, nothing logged yet (the plugin logs once per process)."""
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv(vllm_plugin.VARIABLE, raising=False)
    for cached in (vllm_plugin._log_once, vllm_plugin._manager_class, vllm_plugin._scheduler_class):
        cached.cache_clear()
    caplog.set_level(logging.INFO, logger=vllm_plugin.logger.name)  # pytest also listens on vLLM's logger
    yield
    setattr(BlockSpaceManager, CHOOSER, VLLMS_CHOOSER)


def logged(caplog, level: int | None = None) -> list[str]:
    """The plugin's lines (at ``level``, or all)."""
    ours = (r for r in caplog.records if r.name == vllm_plugin.logger.name)
    return [r.getMessage() for r in ours if level is None or r.levelno == level]


def chooser_is_vllms() -> bool:
    return BlockSpaceManager.__dict__[CHOOSER] is VLLMS_CHOOSER


@pytest.fixture(scope="module")
def v():
    return bench.import_vllm()


@pytest.fixture(scope="module")
def settings():
    return bench.parse_args([*SETTINGS, "--requests", str(REPLAY)])


@pytest.fixture(scope="module")
def requests():
    return bench.make_requests(load_trace(None, REPLAY))


def build(v, settings, requests, scheduler_cls=None):
    """A scheduler as vLLM's engine builds it, caching on."""
    return bench.build_scheduler(v, settings, True, bench.default_max_model_len(requests), scheduler_cls)


@pytest.mark.parametrize("name", ["fast", "reference"])
def test_the_plugin_makes_vllms_own_scheduler_hold_ours(v, settings, requests, monkeypatch, caplog, name):
    monkeypatch.setenv("BLOCKSPACE_MANAGER", name)
    vllm.plugins.load_general_plugins()
    scheduler = build(v, settings, requests)
    assert type(scheduler) is VllmScheduler
    assert type(scheduler.block_manager) is OURS[name]
    assert scheduler.block_manager.get_num_free_gpu_blocks() == settings.num_gpu_blocks  # vLLM's config reached it
    assert BlockSpaceManager.get_block_space_manager_class("placeholder") is PlaceholderBlockSpaceManager
    assert logged(caplog, logging.INFO) == [
        f"blockspace: vLLM's v0 Scheduler builds blockspace's {name} block manager (BLOCKSPACE_MANAGER={name})"
    ]
    assert not logged(caplog, logging.ERROR)


def test_without_the_variable_vllm_keeps_its_own_manager(v, settings, requests, caplog):
    vllm.plugins.load_general_plugins()
    assert chooser_is_vllms()
    assert type(build(v, settings, requests).block_manager) is SelfAttnBlockSpaceManager
    assert not logged(caplog)


def test_a_fresh_vllm_process_loads_the_plugin_once():
    """No test fixture in the way: vLLM's loader, its once-per-process guard, its log format."""
    code = (
        "from vllm.plugins import load_general_plugins\n"
        "from vllm.core.interfaces import BlockSpaceManager\n"
        "load_general_plugins()\n"
        "load_general_plugins()\n"
        "print(BlockSpaceManager.get_block_space_manager_class('selfattn').__name__)\n"
    )
    env = dict(os.environ, BLOCKSPACE_MANAGER="fast", VLLM_LOGGING_LEVEL="INFO")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[-1] == "FastBlockSpaceManager"
    assert sum("blockspace: vLLM's v0 Scheduler builds blockspace's fast block manager" in line for line in lines) == 1


def test_without_the_variable_the_plugin_does_not_even_import_vllm():
    code = (
        "import sys\n"
        "import blockspace, blockspace.fast, blockspace.reference, blockspace.conformance, blockspace.vllm_plugin\n"
        "blockspace.vllm_plugin.register()\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'vllm'))\n"
    )
    env = {name: value for name, value in os.environ.items() if name != vllm_plugin.VARIABLE}
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


@pytest.mark.parametrize("caching", [True, False], ids=["caching on", "caching off"])
def test_a_mooncake_replay_decides_as_with_vllms_manager(v, settings, requests, monkeypatch, caching):
    """The same requests through vLLM's Scheduler twice: as vLLM builds it,
    then after the plugin loaded; every step's decisions are compared."""
    max_model_len = bench.default_max_model_len(requests)
    own = bench.run_once(v, settings, requests, "vllm", None, caching, max_model_len)
    monkeypatch.setenv("BLOCKSPACE_MANAGER", "fast")
    vllm.plugins.load_general_plugins()
    ours = bench.run_once(v, settings, requests, "plugin", None, caching, max_model_len)
    assert own.manager == "vllm.core.block_manager.SelfAttnBlockSpaceManager"
    assert ours.manager == "blockspace.fast.manager.FastBlockSpaceManager"
    assert bench.first_difference(own, ours) is None
    assert bench.differing_calls(own, ours) == ""
    assert own.stats["scheduled_groups"] > REPLAY and len(own.steps) > REPLAY
    assert (own.stats["gpu_hit_rate"] > 0) == caching


def test_scheduler_cls_builds_ours_for_itself_only(v, settings, requests, monkeypatch, caplog):
    cls = resolve_obj_by_qualname("blockspace.vllm_plugin.Scheduler")  # what --scheduler-cls does
    assert issubclass(cls, VllmScheduler) and cls is vllm_plugin.Scheduler
    assert pickle.loads(pickle.dumps(cls)) is cls
    assert type(build(v, settings, requests, cls).block_manager) is FastBlockSpaceManager
    monkeypatch.setenv("BLOCKSPACE_MANAGER", "reference")
    assert type(build(v, settings, requests, cls).block_manager) is ReferenceBlockSpaceManager
    assert chooser_is_vllms()
    assert type(build(v, settings, requests).block_manager) is SelfAttnBlockSpaceManager
    assert not logged(caplog)


@pytest.mark.parametrize("name", ["fast", "reference"])
def test_install_reaches_a_scheduler_built_by_hand(v, settings, requests, monkeypatch, caplog, name):
    """Built straight from vLLM's configs, as ``build`` does, a Scheduler
    runs no plugin loader: the variable alone leaves vLLM's manager, and
    ``install`` (no variable) gives it ours."""
    monkeypatch.setenv("BLOCKSPACE_MANAGER", name)
    assert type(build(v, settings, requests).block_manager) is SelfAttnBlockSpaceManager
    monkeypatch.delenv("BLOCKSPACE_MANAGER")
    vllm_plugin.install(name)
    scheduler = build(v, settings, requests)
    assert type(scheduler) is VllmScheduler
    assert type(scheduler.block_manager) is OURS[name]
    assert scheduler.block_manager.get_num_free_gpu_blocks() == settings.num_gpu_blocks
    assert BlockSpaceManager.get_block_space_manager_class("placeholder") is PlaceholderBlockSpaceManager
    assert logged(caplog, logging.INFO) == [
        f"blockspace: vLLM's v0 Scheduler builds blockspace's {name} block manager (install)"
    ]


def test_install_again_the_last_name_wins(v, settings, requests):
    vllm_plugin.install("fast")
    vllm_plugin.install("reference")
    assert type(build(v, settings, requests).block_manager) is ReferenceBlockSpaceManager
    vllm_plugin.install()
    assert type(build(v, settings, requests).block_manager) is FastBlockSpaceManager


def test_install_raises_what_the_plugin_would_log(v, settings, requests, monkeypatch, caplog):
    """Asked in code, by name: a wrong name or a vLLM we do not know is an
    error of the call, and vLLM's chooser is left as it was."""
    with pytest.raises(InvalidArgumentError) as raised:
        vllm_plugin.install("turbo")
    assert str(raised.value) == "vllm_plugin.install: 'turbo' is not one of fast, reference"
    monkeypatch.setattr(vllm, "__version__", "0.10.1")
    with pytest.raises(ImportError) as raised:
        vllm_plugin.install("fast")
    assert str(raised.value) == (
        "blockspace: vLLM 0.10.1 is a version blockspace does not know; it plugs into vLLM 0.9.x only "
        "(built against 0.9.2)"
    )
    assert chooser_is_vllms()
    assert type(build(v, settings, requests).block_manager) is SelfAttnBlockSpaceManager
    assert not logged(caplog)


def test_an_unknown_value_is_one_error_line_and_vllm_unchanged(v, settings, requests, monkeypatch, caplog):
    monkeypatch.setenv("BLOCKSPACE_MANAGER", "turbo")
    vllm.plugins.load_general_plugins()
    vllm_plugin.register()  # a second load in the same process
    assert chooser_is_vllms()
    assert type(build(v, settings, requests).block_manager) is SelfAttnBlockSpaceManager
    assert type(build(v, settings, requests, vllm_plugin.Scheduler).block_manager) is SelfAttnBlockSpaceManager
    assert logged(caplog, logging.ERROR) == [
        "blockspace: BLOCKSPACE_MANAGER='turbo' is not one of fast, reference; vLLM's own block manager is used"
    ]


@pytest.mark.parametrize(
    ("version", "has_v0_core", "reason"),
    [
        ("0.10.1", True, "vLLM 0.10.1 is a version blockspace does not know"),
        ("0.11.0", False, "vLLM 0.11.0 has no v0 core (vllm.core.interfaces, gone since 0.11)"),
    ],
)
def test_a_vllm_we_do_not_support_is_refused_in_one_line(
    v, settings, requests, monkeypatch, caplog, version, has_v0_core, reason
):
    monkeypatch.setattr(vllm, "__version__", version)
    if not has_v0_core:
        for module in ("vllm.core.interfaces", "vllm.core.scheduler"):
            monkeypatch.setitem(sys.modules, module, None)  # an import of it now fails
    monkeypatch.setenv("BLOCKSPACE_MANAGER", "fast")
    vllm.plugins.load_general_plugins()
    vllm_plugin.register()
    assert chooser_is_vllms()
    assert type(build(v, settings, requests).block_manager) is SelfAttnBlockSpaceManager
    refusal = f"blockspace: {reason}; it plugs into vLLM 0.9.x only (built against 0.9.2)"
    kept = f"{refusal}, so vLLM's own block manager is used"
    assert logged(caplog, logging.ERROR) == [kept]
    if has_v0_core:  # --scheduler-cls: vLLM's own v0 Scheduler, the line not logged again
        assert vllm_plugin.Scheduler is VllmScheduler
        assert logged(caplog, logging.ERROR) == [kept]
    else:  # no v0 Scheduler to hand back
        with pytest.raises(ImportError) as raised:
            resolve_obj_by_qualname("blockspace.vllm_plugin.Scheduler")
        failed = f"{refusal}, and this vLLM has no v0 Scheduler to hand back"
        assert str(raised.value) == failed
        assert logged(caplog, logging.ERROR) == [kept, failed]
    assert not logged(caplog, logging.INFO)
