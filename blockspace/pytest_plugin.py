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
  full profile without editing the test files.
"""

from __future__ import annotations

from typing import Any

MARKER = "blockspace_conformance"
_profile: str | None = None  # --blockspace-profile, once pytest is configured


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("blockspace", "blockspace conformance kit")
    group.addoption(
        "--blockspace-profile",
        metavar="NAME",
        default=None,
        help="run every ManagerConformance test class with this kit profile (quick, full)",
    )


def pytest_configure(config: Any) -> None:
    global _profile
    config.addinivalue_line("markers", f"{MARKER}: a test of the blockspace conformance kit (ManagerConformance)")
    _profile = config.getoption("blockspace_profile", default=None)


def profile_override() -> str | None:
    """The profile named by ``--blockspace-profile``, or None."""
    return _profile
