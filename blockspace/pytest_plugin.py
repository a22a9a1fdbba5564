"""blockspace's pytest plugin: pytest loads it wherever blockspace is
installed (entry point ``pytest11``), as it does Hypothesis's.

It registers what the conformance kit's tests use, and imports nothing of
the kit: it costs nothing, and cannot fail where the ``[conformance]``
extra is not installed.

* Marker ``blockspace_conformance``: every test of a ``ManagerConformance``
  subclass carries it. ``-m blockspace_conformance`` runs only the kit's
  tests, ``-m "not blockspace_conformance"`` all but them.
* Option ``--blockspace-profile NAME``: every ``ManagerConformance``
  subclass runs with that profile (``quick``, ``full``) instead of its own,
  as ``--hypothesis-profile`` does for Hypothesis: a nightly job can run the
  full profile without editing the test files. An unknown name is a usage
  error of the whole run, before any test: were it found by the kit's tests
  alone, the others would run and pass, and a nightly job's typo would look
  like a short green run.
* Option ``--blockspace-scopes NAME,NAME`` (or ``all``): every
  ``ManagerConformance`` subclass explores these scopes in
  ``test_exhaustive`` instead of its ``exhaustive_scopes``. A class makes
  one ``test_exhaustive`` for each scope it explores, and none for the
  others (some take minutes), so this is how to run them by hand. The
  names are checked by the tests themselves, against the kit's list of
  scopes, which this module does not import: a wrong one fails its test.
"""

from __future__ import annotations

from typing import Any

from blockspace.kit_options import PROFILES

MARKER = "blockspace_conformance"
ALL_SCOPES = "all"
_profile: str | None = None  # --blockspace-profile, once pytest is configured
_scopes: tuple[str, ...] | None = None  # --blockspace-scopes, once pytest is configured


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("blockspace", "blockspace conformance kit")
    group.addoption(
        "--blockspace-profile",
        metavar="NAME",
        default=None,
        help=f"run every ManagerConformance test class with this kit profile ({', '.join(PROFILES)})",
    )
    group.addoption(
        "--blockspace-scopes",
        metavar="NAMES",
        default=None,
        help="explore these scopes (comma-separated, or all) in every ManagerConformance test class's "
        "test_exhaustive, instead of its exhaustive_scopes",
    )


def pytest_configure(config: Any) -> None:
    import pytest

    global _profile, _scopes
    config.addinivalue_line("markers", f"{MARKER}: a test of the blockspace conformance kit (ManagerConformance)")
    name = config.getoption("blockspace_profile", default=None)
    if name is not None and name not in PROFILES:
        raise pytest.UsageError(
            f"--blockspace-profile: unknown conformance profile {name!r} (known: {', '.join(PROFILES)})"
        )
    _profile = name
    scopes = config.getoption("blockspace_scopes", default=None)
    _scopes = None if scopes is None else tuple(scope.strip() for scope in scopes.split(",") if scope.strip())
    if _scopes == ():
        raise pytest.UsageError(f"--blockspace-scopes: name at least one scope, or {ALL_SCOPES}")


def profile_override() -> str | None:
    """The profile named by ``--blockspace-profile``, or None."""
    return _profile


def scopes_override() -> tuple[str, ...] | None:
    """The scopes named by ``--blockspace-scopes`` (``("all",)`` for all), or None."""
    return _scopes
