"""``blockspace bench``: the reference and the fast manager side by side.

One run measures, for both implementations, with the ratio:

- per-method latency (one call, best of several rounds);
- a decode-heavy replay of the Mooncake trace through a small v0-style
  scheduler (manager calls per second);
- one batched decode step for 256, 1,024 and 4,096 running sequences: the
  fast manager's batched API against the per-sequence calls a v0 scheduler
  and model runner make on the reference (with and without building the
  block-table and slot-mapping tensors);
- start-up in fresh processes: import plus the first calls, with a cold and a
  warm Numba cache.

``--json PATH`` writes the figures, ``--markdown PATH`` a report with the
machine described (docs/performance.md), ``--quick`` a smaller run (each
part then measures less). The two files must be two files (checked, like
every path, before anything is measured).
A benchmark, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from blockspace.bench.batched import batched_step
from blockspace.bench.methods import method_latency
from blockspace.bench.replay import replay_throughput
from blockspace.bench.report import kept_preamble, markdown
from blockspace.bench.startup import machine, startup
from blockspace.errors import BlockSpaceError, InvalidArgumentError
from blockspace.validation import check_distinct_outputs, check_output_file, command_parser, refuse, write_output


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("blockspace bench", __doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests, sizes and rounds")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON (default: not written)")
    parser.add_argument("--markdown", metavar="PATH",
                        help="write the report, after what the file holds up to its report marker"
                             " (e.g. docs/performance.md; default: not written)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 2 for a bad option (said before anything is measured)."""
    try:
        args = build_parser().parse_args(argv)
        if args.json:
            check_output_file(args.json, "--json")
        if args.markdown:
            check_output_file(args.markdown, "--markdown")
            try:  # read now, not after the whole run: the file may not be text
                preamble = kept_preamble(Path(args.markdown))
            except (OSError, UnicodeDecodeError) as error:
                raise InvalidArgumentError(f"--markdown {args.markdown}: cannot read it ({error})") from None
        if args.json and args.markdown:  # one file would hold the report, the figures lost under it
            check_distinct_outputs({"--json": Path(args.json), "--markdown": Path(args.markdown)})
    except BlockSpaceError as error:
        return refuse(error)
    results: dict[str, Any] = {"quick": args.quick, "machine": machine()}
    for name, run in (
        ("startup", startup),
        ("methods", method_latency),
        ("replay", replay_throughput),
        ("batched", batched_step),
    ):
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results[name] = run(args.quick)
    report = markdown(results)
    print(report)
    if args.json:
        write_output(args.json, json.dumps(results, indent=2))
    if args.markdown:
        write_output(args.markdown, preamble + report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
