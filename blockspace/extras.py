"""The optional parts of the package, and the extra that installs each.

``pip install blockspace`` gives the interface and both managers: NumPy and
Numba, nothing else. Each other part needs modules that are large (torch) or
that only some users want, so they come as extras named after what they
serve::

    pip install 'blockspace[conformance]'  # the kit: blockspace conformance, ManagerConformance, soak
    pip install 'blockspace[sim]'          # blockspace simulate's plot and progress bar
    pip install 'blockspace[gpu]'          # CUDA kernels, block tables as torch tensors, gpu-bench
    pip install 'blockspace[bench]'        # blockspace bench (its model-runner step builds torch tensors)
    pip install 'blockspace[ray]'          # --executor ray: the explorer, sweeps and searches on a Ray cluster

A part checks its modules before it does any work, and a missing one is a
``MissingExtraError`` naming the extra; the ``blockspace`` command turns it
into one ``error:`` line and exit status 2.
"""

from __future__ import annotations

from importlib.util import find_spec

from blockspace.errors import MissingExtraError

EXTRAS: dict[str, tuple[str, ...]] = {  # extra -> the modules it installs (import names)
    "conformance": ("hypothesis", "crosshair", "hypothesis_crosshair_provider", "pytest", "rich"),
    "sim": ("matplotlib", "rich"),
    "gpu": ("torch", "numba_cuda"),
    "bench": ("torch",),
    "ray": ("ray",),
}


def missing_modules(extra: str, modules: tuple[str, ...] = ()) -> list[str]:
    """Which of ``modules`` (default: all of the extra's) cannot be imported."""
    return [name for name in modules or EXTRAS[extra] if find_spec(name) is None]


def missing_extra(extra: str, what: str, missing: list[str]) -> MissingExtraError:
    """The error for ``what`` lacking ``missing`` modules of ``extra``."""
    return MissingExtraError(
        f"{what} needs the [{extra}] extra (missing: {', '.join(missing)}): pip install 'blockspace[{extra}]'"
    )


def require(extra: str, what: str, *modules: str) -> None:
    """Raise ``MissingExtraError`` unless ``modules`` (default: all of the
    extra's) can be imported; ``what`` names the part that needs them."""
    missing = missing_modules(extra, modules)
    if missing:
        raise missing_extra(extra, what, missing)


__all__ = ["EXTRAS", "missing_extra", "missing_modules", "require"]
