"""The situation table of docs/conformance.md, from a conformance report.

    blockspace conformance --impl fast --profile exhaustive --json report.json
    python scripts/situation_table.py report.json

One row per situation of ``conformance/situations.py``: its sections of the
spec, what it is, the scopes of the run that reached it, the shallowest
depth (moves from the start) at which one did, and the wrong implementation
it kills (``conformance/wrong.py``: each situation's plausible wrong rule,
caught by a scope that reaches it or by the check named beside it).
"""

from __future__ import annotations

import json
import sys

from blockspace.conformance.situations import SITUATIONS
from blockspace.conformance.wrong import table_cell


def table(report: dict) -> str:
    reached = (report.get("situations") or {}).get("reached", {})
    headings = ("situation", "spec", "what happens", "scopes that reach it", "shallowest depth",
                "wrong implementation it kills")  # fmt: skip
    lines = [f"| {' | '.join(headings)} |", "|---|---|---|---|---:|---|"]
    for situation in SITUATIONS:
        seen = reached.get(situation.name)
        scopes = ", ".join(f"`{name}`" for name in seen["scopes"]) if seen else "none"
        depth = str(seen["depth"]) if seen else "-"
        lines.append(
            f"| `{situation.name}` | {', '.join(situation.sections)} | {situation.says} | {scopes} | {depth} "
            f"| {table_cell(situation.name)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/situation_table.py REPORT.json")
    try:
        document = json.loads(open(sys.argv[1], encoding="utf-8").read())
    except (OSError, ValueError) as error:
        print(f"error: {sys.argv[1]}: {error}", file=sys.stderr)
        sys.exit(2)
    print(table(document))
