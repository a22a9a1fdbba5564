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
"""

from __future__ import annotations

from typing import Any

from blockspace.kit_options import PROFILES

MARKER = "blockspace_conformance"
_profile: str | None = None  # --blockspace-profile, once pytest is configured


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("blockspace", "blockspace conformance kit")
    group.addoption(
        "--blockspace-profile",
        metavar="NAME",
        default=None,
        help=f"run every ManagerConformance test class with this kit profile ({', '.join(PROFILES)})",
    )


def pytest_configure(config: Any) -> None:
    import pytest

    global _profile
    config.addinivalue_line("markers", f"{MARKER}: a test of the blockspace conformance kit (ManagerConformance)")
    name = config.getoption("blockspace_profile", default=None)
    if name is not None and name not in PROFILES:
        raise pytest.UsageError(
            f"--blockspace-profile: unknown conformance profile {name!r} (known: {', '.join(PROFILES)})"
        )
    _profile = name


def profile_override() -> str | None:
    """The profile named by ``--blockspace-profile``, or None."""
    return _profile
