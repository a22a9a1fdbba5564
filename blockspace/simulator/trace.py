"""Loading a request trace in the Mooncake format, every line validated.

One JSON object a line, the format of the Mooncake traces (kvcache-ai/Mooncake,
``FAST25-release/traces/``; the package bundles the head of the conversation trace)::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

``timestamp`` is the arrival time in milliseconds from the trace start,
``hash_ids`` one chunk id per 512 prompt tokens. A trace is input from
outside, so every line is checked before anything runs, and a bad one stops
the load with an error naming the file and the line: a simulation that
silently skipped or misread requests would report wrong figures.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from blockspace.errors import InvalidArgumentError
from blockspace.simulator.tokens import CHUNK_TOKENS, NUM_CHUNK_IDS

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
BUNDLED_SAMPLE = "mooncake_sample.jsonl"


class TraceError(InvalidArgumentError):
    """A trace line that is not a valid Mooncake request."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace; ``index`` is its position (0-based)."""

    index: int
    arrival_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_line(text: str, where: str) -> dict[str, Any]:
    """The checked fields of one line; ``where`` names it in errors."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in FIELDS:
        if name not in row:
            raise TraceError(f"{where}: missing field {name!r}")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise TraceError(f"{where}: unknown field {unknown[0]!r} (expected {', '.join(FIELDS)})")

    timestamp = row["timestamp"]
    if not isinstance(timestamp, numbers.Real) or isinstance(timestamp, bool) or not math.isfinite(timestamp):
        raise TraceError(f"{where}: field 'timestamp' must be a number of milliseconds, got {timestamp!r}")
    if timestamp < 0:
        raise TraceError(f"{where}: field 'timestamp' must be >= 0, got {timestamp!r}")
    for name in ("input_length", "output_length"):
        value = row[name]
        if not _is_int(value):
            raise TraceError(f"{where}: field {name!r} must be an integer, got {value!r}")
        if value < 1:
            raise TraceError(f"{where}: field {name!r} must be >= 1, got {value}")
    hash_ids = row["hash_ids"]
    if not isinstance(hash_ids, list):
        raise TraceError(f"{where}: field 'hash_ids' must be a list of chunk ids, got {hash_ids!r}")
    for chunk in hash_ids:
        if not _is_int(chunk) or not 0 <= chunk < NUM_CHUNK_IDS:
            raise TraceError(f"{where}: field 'hash_ids' holds {chunk!r}, not an integer in 0..{NUM_CHUNK_IDS - 1}")
    num_chunks = -(-row["input_length"] // CHUNK_TOKENS)
    if len(hash_ids) != num_chunks:
        raise TraceError(
            f"{where}: field 'hash_ids' has {len(hash_ids)} chunk ids, but input_length "
            f"{row['input_length']} needs {num_chunks} (one per {CHUNK_TOKENS} tokens)"
        )
    return row


def parse_lines(lines: Iterable[str], source: str, max_requests: int | None = None) -> list[TraceRequest]:
    """Requests from JSONL lines (blank lines are skipped); arrivals must not
    go backwards, since the order of the file is the FCFS order."""
    requests: list[TraceRequest] = []
    previous_ms = 0.0
    for line_number, text in enumerate(lines, start=1):
        if max_requests is not None and len(requests) >= max_requests:
            break
        if not text.strip():
            continue
        where = f"{source}: line {line_number}"
        row = parse_line(text, where)
        if row["timestamp"] < previous_ms:
            raise TraceError(f"{where}: timestamp {row['timestamp']} is earlier than the line before ({previous_ms})")
        previous_ms = row["timestamp"]
        requests.append(
            TraceRequest(
                index=len(requests),
                arrival_s=row["timestamp"] / 1000.0,
                input_length=row["input_length"],
                output_length=row["output_length"],
                hash_ids=tuple(row["hash_ids"]),
            )
        )
    return requests


def _open_lines(path: str | Path | None) -> Iterator[str]:
    if path is None:
        with resources.files("blockspace").joinpath("data", BUNDLED_SAMPLE).open("r", encoding="utf-8") as handle:
            yield from handle
    else:
        with open(path, encoding="utf-8") as handle:
            yield from handle


def load_trace(path: str | Path | None = None, max_requests: int | None = None) -> list[TraceRequest]:
    """The requests of a trace file, or of the bundled Mooncake sample when
    ``path`` is None; at most ``max_requests`` of them."""
    if max_requests is not None and max_requests < 1:
        raise InvalidArgumentError(f"max_requests must be >= 1, got {max_requests}")
    source = str(path) if path is not None else f"bundled {BUNDLED_SAMPLE}"
    try:
        return parse_lines(_open_lines(path), source, max_requests)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as error:
        raise TraceError(f"cannot read trace {source}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"cannot read trace {source}: not UTF-8 text") from None


def scale_arrivals(requests: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """The same requests with arrival times multiplied by ``factor`` (> 1
    spreads the traffic out: the Mooncake trace was served by a cluster, and
    one simulated GPU needs it slower to run unsaturated)."""
    if not factor > 0:
        raise InvalidArgumentError(f"the arrival time scale must be > 0, got {factor!r}")
    return [replace(request, arrival_s=request.arrival_s * factor) for request in requests]


__all__ = ["BUNDLED_SAMPLE", "TraceError", "TraceRequest", "load_trace", "parse_line", "parse_lines", "scale_arrivals"]
