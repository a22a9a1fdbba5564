"""A step-time model kept in a file: what ``blockspace gpu-profile`` writes
and ``blockspace simulate --step-model FILE`` reads, so that the simulated
clock can run on coefficients measured on a real GPU instead of the
estimates built into ``StepTimeModel``.

The file is one JSON object (docs/simulator.md describes every key)::

    {
      "version": 1,
      "step_overhead_ms": 3.9,
      "prefill_token_us": 41.0,
      "decode_seq_us": 12.0,
      "kv_token_read_ns": 29.0,
      "swap_block_us": 44.0,
      "source": "blockspace gpu-profile 0.1.0, torch 2.5.1",
      "measured_on": "NVIDIA H200",
      "created": "2025-06-01T12:00:00+00:00",
      "model": {"num_layers": 32, "hidden_size": 4096, ...},
      "fit": {"points": [...], "max_relative_error": 0.04}
    }

The version and all five coefficients are required: a file that left one
out would have the simulator fill it with a built-in estimate, and a user
would believe the run measured. The other keys say where the figures come
from; the simulator does not use them. Anything else is refused, so that a
misspelt coefficient is not silently ignored.

One of them is checked against the run: the ``model`` the coefficients
were measured on. Its KV cache (layers, KV heads, head dimension, bytes per
value) must be the one the simulator sizes its blocks by, or the run would
time a small model's steps on a large model's cache (``check_kv_cache``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockspace.errors import InvalidArgumentError, InvalidConfigError
from blockspace.outputs import write_text
from blockspace.simulator.gpu import KVCacheModel, StepTimeModel
from blockspace.validation import Range, check_keys, check_number, option_name, read_json_object

VERSION = 1  # raised when a key changes meaning; a reader refuses any version it does not know
COEFFICIENTS = tuple(field.name for field in dataclasses.fields(StepTimeModel))
REQUIRED = ("version", *COEFFICIENTS)
PROVENANCE: dict[str, type] = {  # optional key -> the JSON type it must have (str: a string, dict: an object)
    "source": str,  # what made the file: a program and its version, or words
    "measured_on": str,  # the device the coefficients were measured on
    "created": str,  # when, as ISO 8601
    "model": dict,  # the model measured: its dimensions and dtype
    "fit": dict,  # the measured points and how well the coefficients fit them
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # the dtypes a ``model`` may name, and their sizes


@dataclass(frozen=True)
class MeasuredClock(StepTimeModel):
    """A ``--step-model`` file's clock: the linear clock of its coefficients,
    named by the file it was read from (the summary says which clock ran)."""

    path: str = ""

    error = None  # a fit's error on its own points is not a prediction's: no range

    def describe(self) -> str:
        return f"measured, {self.path}: {super().describe()}"


def step_model_json(model: StepTimeModel, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The file's object for ``model``, with the ``provenance`` keys (see ``PROVENANCE``)."""
    found = {"version": VERSION, **dataclasses.asdict(model), **(provenance or {})}
    _check_provenance(found, "the step model's provenance")
    check_keys(found, REQUIRED, tuple(PROVENANCE), "the step model")
    return found


def save_step_model(model: StepTimeModel, path: str | Path, provenance: dict[str, Any] | None = None) -> None:
    """Write ``model`` and its ``provenance`` to ``path`` as ``load_step_model`` reads it (whole: ``outputs.py``)."""
    text = json.dumps(step_model_json(model, provenance), indent=2, allow_nan=False)
    write_text(path, text + "\n")


def load_step_model(path: str | Path, kv: KVCacheModel | None = None) -> StepTimeModel:
    """The step-time model the file at ``path`` holds, every key checked,
    and, when ``kv`` is given, the model it was measured on checked to have
    that KV cache (``check_kv_cache``).

    Anything wrong is one ``InvalidArgumentError`` whose message starts with
    the file's name (``--step-model: `` reads well in front of it): the file
    missing or unreadable, not JSON, not an object, an unknown or a missing
    key, a version other than ``VERSION``, a coefficient that is not a finite
    number >= 0, or five that would make a step take no time at all.
    """
    found = read_json_object(path, "step-time coefficients")
    check_keys(found, REQUIRED, tuple(PROVENANCE), str(path))
    version = found["version"]
    if type(version) is not int or version != VERSION:
        raise InvalidArgumentError(
            f"{path}: version {json.dumps(version)} is not one this blockspace reads (it reads version {VERSION})"
        )
    values = {name: check_number(found[name], f"{path}: {name}", Range(least=0)) for name in COEFFICIENTS}
    _check_provenance(found, str(path))
    if kv is not None and "model" in found:
        check_kv_cache(found["model"], kv, str(path))
    try:
        return StepTimeModel(**values)
    except InvalidConfigError as error:
        raise InvalidArgumentError(f"{path}: {error}") from None


def check_kv_cache(profiled: dict[str, Any], kv: KVCacheModel, where: str) -> None:
    """``InvalidArgumentError`` when the file's ``model`` has another KV cache
    than ``kv``: both shapes, and the simulate options that give the file's.

    The coefficients are a measurement of one model: a step of a 2-layer
    model costs a fraction of a step of Llama-3-8B, and the simulator sizes
    its blocks (so how many fit, and how much a swap moves) by ``kv``. A run
    of the one on the other answers for neither. Only what the file says is
    compared: a ``model`` without a field, or a file without ``model``, has
    nothing to compare on it. A field it has must be one the comparison can
    read (a whole number >= 1; a dtype of ``DTYPE_BYTES``).
    """
    found: dict[str, int] = {}
    for field in ("num_layers", "num_kv_heads", "head_dim"):
        if field in profiled:
            value = profiled[field]
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(
                    f"{where}: model.{field} must be a whole number >= 1, got {json.dumps(value)}"
                )
            found[field] = value
    if "dtype" in profiled:
        if profiled["dtype"] not in DTYPE_BYTES:
            raise InvalidArgumentError(
                f"{where}: model.dtype must be one of {', '.join(DTYPE_BYTES)}, got {json.dumps(profiled['dtype'])}"
            )
        found["dtype_bytes"] = DTYPE_BYTES[profiled["dtype"]]
    differ = [field for field, value in found.items() if value != getattr(kv, field)]
    if differ:
        theirs = KVCacheModel(**{**dataclasses.asdict(kv), **found})
        raise InvalidArgumentError(
            f"{where}: measured on a model whose KV cache is {kv_shape(theirs)}, but this run's is {kv_shape(kv)};"
            f" {' '.join(f'{option_name(field)} {found[field]}' for field in differ)} simulates the file's model"
            " (or measure this one with blockspace gpu-profile)"
        )


def kv_shape(kv: KVCacheModel) -> str:
    """A KV cache's shape in words."""
    return (
        f"{kv.num_layers} layers x {kv.num_kv_heads} KV heads x head dim {kv.head_dim} x {kv.dtype_bytes} bytes a value"
        f" ({kv.bytes_per_token:,} bytes per token)"
    )


def _check_provenance(found: dict[str, Any], where: str) -> None:
    """Each provenance key present has its JSON type."""
    for key, kind in PROVENANCE.items():
        if key in found and not isinstance(found[key], kind):
            wanted = "a string" if kind is str else "an object"
            raise InvalidArgumentError(f"{where}: {key} must be {wanted}, got {json.dumps(found[key])}")


__all__ = [
    "COEFFICIENTS",
    "DTYPE_BYTES",
    "PROVENANCE",
    "VERSION",
    "check_kv_cache",
    "load_step_model",
    "save_step_model",
    "step_model_json",
]
