"""Write a synthetic workload as a Mooncake trace file: the requests
``blockspace simulate --workload synthetic`` makes from the same options
(``workloads.synthetic``; the options and their defaults are the
command's own), one JSON line each, so that a peer that reads only trace
files (Dynamo's mocker, through ``python -m blockspace.bench.peer --trace
FILE``) replays the very requests ``blockspace simulate`` makes up.

    python scripts/synthetic_trace.py OUT.jsonl [--requests 1000] [--input-len 1024] [--output-len 128]
        [--input-len-std 0] [--output-len-std 0] [--shared-prefix-ratio 0] [--prefix-groups 1] [--turns 1]
        [--turn-gap 10] [--rate R] [--seed 0]

Exits 2 on a bad argument or output path (nothing written), 130 on Ctrl-C.
"""

from __future__ import annotations

import json
import sys

from blockspace.interrupts import INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    try:  # Ctrl-C while the simulator's modules load ends it too
        return _main(argv)
    except KeyboardInterrupt:
        return INTERRUPTED


def _main(argv: list[str] | None) -> int:
    from blockspace.errors import BlockSpaceError
    from blockspace.simulator.cli import SYNTHETIC_DEFAULTS, SYNTHETIC_OPTIONS
    from blockspace.validation import check_output_file, command_parser, option_name, refuse, write_output
    from blockspace.workloads import SYNTHETIC_REQUESTS, synthetic

    parser = command_parser("synthetic_trace.py", __doc__)
    parser.add_argument("out", metavar="OUT", help="the trace file to write (JSONL)")
    parser.add_argument("--requests", type=int, default=SYNTHETIC_REQUESTS)
    for name, kind, meaning in SYNTHETIC_OPTIONS:
        parser.add_argument(option_name(name), type=kind, default=SYNTHETIC_DEFAULTS[name], help=meaning)
    parser.add_argument("--rate", type=float, help="conversations started a second (default: one a second)")
    parser.add_argument("--seed", type=int, default=0)
    try:
        args = parser.parse_args(argv)
        check_output_file(args.out, "OUT")
        options = {name: getattr(args, name) for name, _, _ in SYNTHETIC_OPTIONS}
        requests = synthetic(args.requests, **options, rate=args.rate, seed=args.seed)
        lines = [
            json.dumps({"timestamp": round(entry.arrival_s * 1000), "input_length": entry.input_length,
                        "output_length": entry.output_length, "hash_ids": list(entry.hash_ids)})
            for entry in requests
        ]  # fmt: skip
        write_output(args.out, "\n".join(lines) + "\n")  # whole or not at all
    except BlockSpaceError as error:
        return refuse(error)
    print(f"{len(lines):,} requests written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
