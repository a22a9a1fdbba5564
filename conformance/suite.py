"""The pytest base class: conformance tests for your own manager.

    from blockspace.conformance.suite import ManagerConformance

    class TestMine(ManagerConformance):
        impl = MyManager                 # a class, "package.module:Class" or "fast"
        supports_encoder_decoder = False # capability flags skip what does not apply

``ManagerConformance`` itself is never collected (``__test__ = False``);
every subclass is. Each test is one check of ``runner.py`` with the
class's ``profile`` (default ``quick``; pytest's ``--blockspace-profile NAME``
overrides it for every class); a failure shows the shrunk call sequence as a
runnable snippet. Every test carries the ``blockspace_conformance`` marker
(registered by ``blockspace.pytest_plugin``).

``test_exhaustive[<scope>]`` is made for each scope the class explores
(``exhaustive_scopes``, default ``("default",)``, the one CI exhausts in
under a minute) and for no other: the other scopes of ``scope.SCOPES``
can take minutes each, and a test made for each only to be skipped would
fill every run's list of skips with tests that can never run. Run them by
hand with the plugin's option, which replaces every class's list::

    pytest tests/test_conformance_suite.py -k test_exhaustive --blockspace-scopes plain,swap
    pytest tests/test_conformance_suite.py -k test_exhaustive --blockspace-scopes all

or with the command, ``blockspace conformance --impl fast --profile
exhaustive --scope plain``.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import pytest

from blockspace.conformance.check import CheckResult, run_machine
from blockspace.conformance.configs import FAMILIES, FAMILY_CAPABILITY
from blockspace.conformance.explore import explore_check
from blockspace.conformance.long_runs import RUNS, long_run_check
from blockspace.conformance.runner import PROFILES
from blockspace.conformance.scope import SCOPES
from blockspace.conformance.sweeps import SWEEPS, sweep_check
from blockspace.conformance.trace import VARIANTS, trace_check
from blockspace.interfaces import BlockSpaceManager, load_manager_class
from blockspace.pytest_plugin import ALL_SCOPES, profile_override, scopes_override
from blockspace.snapshot import SNAPSHOT_KEYS


class ManagerConformance:
    """Subclass it and set ``impl``; flip a ``supports_*`` flag to skip a feature."""

    __test__ = False
    pytestmark: ClassVar[list[Any]] = [pytest.mark.blockspace_conformance]

    impl: ClassVar[Any] = None
    against: ClassVar[Any] = "reference"
    profile: ClassVar[str] = "quick"
    max_examples: ClassVar[int | None] = None  # overrides the profile's examples per family
    supports_caching: ClassVar[bool] = True
    supports_sliding_window: ClassVar[bool] = True
    supports_encoder_decoder: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool | None] = None  # None: use snapshot() when the class has one
    exhaustive_scopes: ClassVar[tuple[str, ...]] = ("default",)  # scopes test_exhaustive explores (scope.SCOPES)
    explore_workers: ClassVar[int | None] = None  # the explorer's processes (None: one per core)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__test__" not in cls.__dict__:
            cls.__test__ = True

    # -- helpers --------------------------------------------------------------------
    @classmethod
    def impl_class(cls) -> type:
        if cls.impl is None:
            raise TypeError(f"{cls.__name__} must set impl = <manager class or 'package.module:Class'>")
        impl = load_manager_class(cls.impl) if isinstance(cls.impl, str) else cls.impl
        if cls.supports_snapshot is False and callable(getattr(impl, "snapshot", None)):
            impl = type(f"{impl.__name__}WithoutSnapshot", (impl,), {"snapshot": None})
        return impl

    @classmethod
    def profile_settings(cls) -> Any:
        """The profile to run: ``--blockspace-profile``, else the class's."""
        name = profile_override() or cls.profile  # the plugin has checked the option's name already
        if name not in PROFILES:
            pytest.fail(
                f"{cls.__name__}.profile: unknown conformance profile {name!r} (known: {', '.join(PROFILES)})",
                pytrace=False,
            )
        return PROFILES[name]

    @classmethod
    def scopes_to_explore(cls) -> tuple[str, ...]:
        """The scopes ``test_exhaustive`` explores: ``--blockspace-scopes``, else the class's."""
        names = scopes_override() or cls.exhaustive_scopes
        return tuple(SCOPES) if names == (ALL_SCOPES,) else names

    def pytest_generate_tests(self, metafunc: Any) -> None:
        """pytest's hook, called for each test of the class: ``test_exhaustive``
        gets one test for each scope to explore, and none for the others."""
        if metafunc.function.__name__ == "test_exhaustive":
            metafunc.parametrize("scope", list(self.scopes_to_explore()))

    @classmethod
    def impls(cls) -> dict[str, Any]:
        return {"reference": cls.against, "impl": cls.impl_class()}

    @classmethod
    def capabilities(cls) -> dict[str, bool]:
        return {
            name: getattr(cls, name)
            for name in ("supports_caching", "supports_sliding_window", "supports_encoder_decoder")
        }

    @staticmethod
    def require(result: CheckResult) -> None:
        if result.status == "skipped":
            pytest.skip(result.detail)
        if result.status == "failed":
            pytest.fail(result.detail, pytrace=False)

    # -- the checks -------------------------------------------------------------------
    def test_interface(self) -> None:
        """Every method a v0 scheduler calls, with vLLM's parameter names."""
        impl = self.impl_class()
        for name in BlockSpaceManager.__abstractmethods__:
            method = getattr(impl, name, None)
            assert callable(method), f"{impl.__name__} has no method {name}"
            expected = list(inspect.signature(getattr(BlockSpaceManager, name)).parameters)
            assert list(inspect.signature(method).parameters)[: len(expected)] == expected, f"{name}: parameters differ"

    def test_snapshot_format(self) -> None:
        impl = self.impl_class()
        if not callable(getattr(impl, "snapshot", None)):
            pytest.skip("no snapshot(): invariants are checked from return values only")
        snap = impl(block_size=4, num_gpu_blocks=4, num_cpu_blocks=2).snapshot()
        assert set(snap) == set(SNAPSHOT_KEYS)

    @pytest.mark.parametrize("family", list(FAMILIES))
    def test_state_machine(self, family: str) -> None:
        needed = FAMILY_CAPABILITY[family]
        if needed is not None and not getattr(self, needed):
            pytest.skip(f"{needed} is False")
        profile = self.profile_settings()
        changes: dict[str, Any] = {"max_examples": self.max_examples} if self.max_examples else {}
        self.require(run_machine(self.impls(), family, profile, **changes))

    @pytest.mark.parametrize("run", list(RUNS))
    def test_long_run(self, run: str) -> None:
        self.require(long_run_check(self.impls(), self.capabilities(), run).run())

    @pytest.mark.parametrize("name", list(SWEEPS))
    def test_sweep(self, name: str) -> None:
        self.require(sweep_check(self.impls(), self.capabilities(), name).run())

    def test_exhaustive(self, scope: str) -> None:
        """The explorer over ``scope``, one of ``scopes_to_explore()`` (``pytest_generate_tests``)."""
        if scope not in SCOPES:
            pytest.fail(f"{type(self).__name__}: unknown scope {scope!r} (known: {', '.join(SCOPES)})", pytrace=False)
        self.require(explore_check(self.impls(), scope, self.capabilities(), self.explore_workers).run())

    @pytest.mark.parametrize("variant", list(VARIANTS))
    def test_trace_replay(self, variant: str) -> None:
        self.require(
            trace_check(self.impls(), self.profile_settings().trace_requests, self.capabilities(), variant).run()
        )
