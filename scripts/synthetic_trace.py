"""Write a synthetic workload as a Mooncake trace file: ``--workload
synthetic``'s requests (``workloads.synthetic``), one JSON line each, so
that a peer that reads only trace files (Dynamo's mocker, through
``python -m blockspace.bench.peer --trace FILE``) replays the very requests
``blockspace simulate`` makes up.

    python scripts/synthetic_trace.py OUT.jsonl [--requests 10000] [--input-len 4096] [--output-len 256]
        [--shared-prefix-ratio 0.5] [--prefix-groups 8] [--turns 4] [--turn-gap 30] [--rate 2] [--seed 0]

Exits 2 on a bad argument or output path (nothing written), 130 on Ctrl-C.
"""

from __future__ import annotations

import json
import sys

from blockspace.errors import BlockSpaceError
from blockspace.interrupts import INTERRUPTED
from blockspace.validation import check_output_file, command_parser, refuse, write_output
from blockspace.workloads import synthetic


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("synthetic_trace.py", __doc__)
    parser.add_argument("out", metavar="OUT", help="the trace file to write (JSONL)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--input-len", type=int, default=4096)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--input-len-std", type=float, default=1024.0)
    parser.add_argument("--output-len-std", type=float, default=64.0)
    parser.add_argument("--shared-prefix-ratio", type=float, default=0.5)
    parser.add_argument("--prefix-groups", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-gap", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=2.0, help="conversations started a second")
    parser.add_argument("--seed", type=int, default=0)
    try:
        args = parser.parse_args(argv)
        check_output_file(args.out, "OUT")
        requests = synthetic(
            args.requests, input_len=args.input_len, output_len=args.output_len, input_len_std=args.input_len_std,
            output_len_std=args.output_len_std, shared_prefix_ratio=args.shared_prefix_ratio,
            prefix_groups=args.prefix_groups, turns=args.turns, turn_gap=args.turn_gap, rate=args.rate,
            seed=args.seed,
        )  # fmt: skip
    except BlockSpaceError as error:
        return refuse(error)
    except KeyboardInterrupt:
        return INTERRUPTED
    lines = [
        json.dumps({"timestamp": round(entry.arrival_s * 1000), "input_length": entry.input_length,
                    "output_length": entry.output_length, "hash_ids": list(entry.hash_ids)})
        for entry in requests
    ]  # fmt: skip
    try:
        write_output(args.out, "\n".join(lines) + "\n")
    except KeyboardInterrupt:
        return INTERRUPTED
    print(f"{len(lines):,} requests written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
