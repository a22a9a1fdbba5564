"""The compiled engine is the Python engine's twin: the same decisions,
block tables, copy-on-write pairs, swap mappings and figures.

Random small traces are ``test_simulator_random.py``'s (the compiled
engine is one of its runs); here are its parts held to the Python forms
they replace (the token ids it makes, the digest it hashes), the
configurations issue #41 lists (small in CI, in full behind ``-m slow``),
what it refuses, and the state it leaves the manager in.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from blockspace.errors import InvalidArgumentError, InvalidConfigError
from blockspace.interfaces import load_manager_class
from blockspace.simulator import SchedulerConfig, SimulationConfig, load_trace, run_simulation
from blockspace.simulator.cli import main
from blockspace.simulator.compiled import digest as D
from blockspace.simulator.compiled import state as S
from blockspace.simulator.compiled import trace_keys as TK
from blockspace.simulator.compiled.engine import run_compiled
from blockspace.simulator.compiled.tokens import write_tokens
from blockspace.simulator.engines import replay, resolve
from blockspace.simulator.gpus import gpu_named
from blockspace.simulator.metrics import Counts, Timeline
from blockspace.simulator.models import model_named
from blockspace.simulator.report import first_difference
from blockspace.simulator.roofline import Roofline
from blockspace.simulator.simulation import SimulationStalledError
from blockspace.simulator.summary import Summary, summarize
from blockspace.workloads import TraceRequest, output_token_id, parse_lines, prompt_token_ids, scale_arrivals
from helpers import jit_or

CONVERSATION = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation.jsonl"


# -- the parts ------------------------------------------------------------------------------
def test_the_tokens_it_makes_are_the_token_lists_of_the_python_engine():
    """Prompt tokens from chunk ids (the last chunk cut short), then the
    generated ones, for any span a kernel asks for."""
    rng = random.Random(7)
    trace = []
    for index in range(20):
        length = rng.randint(1, 3 * 512)
        trace.append(
            TraceRequest(index, 0.0, length, 50, tuple(rng.randrange(2**21) for _ in range(-(-length // 512))))
        )
    requests, chunks = S.new_requests(trace, 3, None)
    out = np.zeros(4000, np.int64)
    for r in range(len(requests.arrival)):
        entry = trace[int(requests.trace_index[r])]
        num_output = rng.randint(0, 40)
        expected = prompt_token_ids(entry.hash_ids, entry.input_length) + [
            output_token_id(entry.index, int(requests.sample[r]), position) for position in range(num_output)
        ]
        start = rng.randint(0, len(expected))
        end = rng.randint(start, len(expected))
        assert write_tokens(requests, chunks, r, start, end, out).tolist() == expected[start:end]


def _digest_of(tables, copies, swap_in, swap_out):
    """The compiled digest of the tuple the Python engine hashes."""
    acc = D.start()
    for seq_id, blocks in tables:
        entry = np.uint64(D.add(D.start(), np.uint64(seq_id)))
        entry = np.uint64(D.add(entry, np.uint64(D.ints(np.array(blocks or [0], np.int64), len(blocks)))))
        acc = np.uint64(D.add(np.uint64(acc), np.uint64(D.finish(entry, 2))))
    whole = np.uint64(D.add(D.start(), np.uint64(D.finish(np.uint64(acc), len(tables)))))
    for pairs in (copies, swap_in, swap_out):
        flat = np.array([value for pair in pairs for value in pair] or [0], np.int64)
        whole = np.uint64(D.add(whole, np.uint64(D.pairs(flat, len(pairs)))))
    return D.signed(D.finish(whole, 4))


def test_the_digest_is_cpythons_hash_of_the_python_engines_tuple():
    rng = random.Random(3)
    with np.errstate(over="ignore"):
        for _ in range(300):
            tables = [(rng.randrange(10**6), tuple(rng.randrange(10**5) for _ in range(rng.randrange(12))))
                      for _ in range(rng.randrange(6))]  # fmt: skip
            copies, swap_in, swap_out = (
                [(rng.randrange(999), rng.randrange(999)) for _ in range(rng.randrange(4))] for _ in range(3)
            )
            expected = hash((tuple(tables), tuple(copies), tuple(swap_in), tuple(swap_out)))
            assert _digest_of(tables, copies, swap_in, swap_out) == expected


# -- equal to the Python engine ---------------------------------------------------------------
def config_of(num_gpu_blocks=49_152, num_cpu_blocks=2_048, **scheduler) -> SimulationConfig:
    return SimulationConfig(
        num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
        scheduler=SchedulerConfig(record_tables=True, **scheduler),
    )  # fmt: skip


def figures(summary: Summary) -> dict:
    return {key: value for key, value in summary.to_json().items() if key not in ("engine", "manager_time", "wall_s",
                                                                        "manager_startup_s")}  # fmt: skip


def assert_twins(trace, config):
    """Both engines replay ``trace`` under ``config`` with every record and figure equal."""
    fast = load_manager_class("fast")
    python = run_simulation(trace, fast, config)
    compiled = run_compiled(trace, fast, replace(config, engine="compiled"))
    assert first_difference(python.records, compiled.records) is None
    assert len(python.records) == len(compiled.records)
    assert figures(summarize(python)) == figures(summarize(compiled))
    records = [python.metrics.request_record(r) for r in python.metrics.requests]
    assert records == [compiled.metrics.request_record(r) for r in compiled.metrics.requests]
    assert list(python.metrics.itl_s) == list(compiled.metrics.itl_s)
    assert python.metrics.timeline.__dict__.keys() == compiled.metrics.timeline.__dict__.keys()
    for name, values in python.metrics.timeline.__dict__.items():
        if name != "manager_s":
            assert values == getattr(compiled.metrics.timeline, name), name
    compiled.manager.check_invariants()
    assert compiled.manager.snapshot() == python.manager.snapshot()
    return python, compiled


def small_trace(count: int) -> list[TraceRequest]:
    """Small requests in three shared prompts, arriving fast: a pool of tens of blocks preempts and swaps."""
    lines = [
        json.dumps({"timestamp": 50 * i, "input_length": 100 + 37 * (i % 7), "output_length": 30 + 11 * (i % 5),
                    "hash_ids": [i % 3]})
        for i in range(count)
    ]  # fmt: skip
    return parse_lines(lines, "small requests")


# Issue #41's list, small enough for CI (the full sizes: test_the_listed_configurations_in_full); the
# cases without a tight pool shorter without the JIT (helpers.jit_or).
LISTED = {
    "the bundled sample": (lambda: load_trace(None, jit_or(25, 8)), config_of()),
    "caching off": (lambda: load_trace(None, jit_or(25, 8)), config_of(enable_prefix_caching=False)),
    "recompute, a tight pool": (lambda: load_trace(None, 40), config_of(num_gpu_blocks=900)),
    "swap, a tight pool": (
        lambda: small_trace(40),
        config_of(40, 400, preemption_mode="swap", max_num_batched_tokens=512),
    ),
    "swap, n = 3, a tight pool": (
        lambda: small_trace(40),
        replace(config_of(60, 400, preemption_mode="swap", max_num_batched_tokens=512), num_samples=3),
    ),
    "recompute, n = 3, a tight pool": (
        lambda: small_trace(40),
        replace(config_of(60, 400, max_num_batched_tokens=512), num_samples=3),
    ),
    "n = 3": (lambda: load_trace(None, jit_or(12, 4)), replace(config_of(num_gpu_blocks=2_000), num_samples=3)),
    "time scale 4": (lambda: scale_arrivals(load_trace(None, jit_or(25, 8)), 4.0), config_of(num_gpu_blocks=3_000)),
    "block size 48, small budget": (
        lambda: load_trace(None, 40),
        config_of(num_gpu_blocks=900, block_size=48, max_num_batched_tokens=480),
    ),
    # the roofline clock (roofline.py): tensor parallelism and swapping, and a mixture of experts
    "roofline, 70B at TP 4, swap, a tight pool": (
        lambda: small_trace(40),
        replace(
            config_of(40, 400, preemption_mode="swap", max_num_batched_tokens=512),
            step_time=Roofline(gpu_named("H100-SXM"), model_named("llama-3.1-70b"), tensor_parallel=4),
        ),
    ),
    "roofline, a mixture of experts, FP8": (
        lambda: load_trace(None, jit_or(25, 8)),
        replace(
            config_of(num_gpu_blocks=900), step_time=Roofline(gpu_named("H200"), model_named("mixtral-8x7b"), 2, "fp8")
        ),
    ),
}


@pytest.mark.parametrize("name", list(LISTED))
def test_the_compiled_engine_decides_as_the_python_one(name):
    trace, config = LISTED[name]
    python, _ = assert_twins(trace(), config)
    counts = python.metrics.counts
    if "swap" in name:
        assert counts.swap_outs and counts.swap_ins  # the case does what it is named for
    if "tight" in name:
        assert counts.swap_outs or counts.recompute_preemptions


def test_a_count_or_a_timeline_column_declared_in_metrics_has_its_place_in_the_compiled_state():
    """``metrics.Counts`` and ``metrics.Timeline`` declare the figures; the
    compiled loop's slots and rows are laid out from them, so a new count is
    one field there (and its count in each engine), not a slot typed apart."""
    names = [field.name for field in fields(Counts)]
    slots = [S.count_slot(name) for name in names]
    assert slots == list(range(S.FIRST_COUNT, S.NUM_META)) and S.FIRST_COUNT == S.IS_STALLED + 1
    columns = [field.name for field in fields(Timeline)]
    assert [S.timeline_row(name) for name in columns if name != "manager_s"] == list(range(len(columns) - 1))
    with pytest.raises(ValueError):
        S.count_slot("not_a_count")


def test_more_requests_ignored_in_one_step_than_the_logs_first_hold():
    """3,000 prompts too long for the pool arrive at once: one step ignores
    them all, each a request done. The loop's logs start at 1,024 entries,
    so the admissions must ask for room as they go (``policy.room_to_admit``)."""
    trace = [TraceRequest(i, 0.0, 500, 4, (i,)) for i in range(3_000)]  # 32 blocks each: never admitted
    config = config_of(num_gpu_blocks=20, num_cpu_blocks=0)
    python, compiled = assert_twins(trace, config)
    assert len(compiled.metrics.requests) == 3_000
    assert python.metrics.counts == compiled.metrics.counts
    assert summarize(compiled).requests.ignored == 3_000


def test_a_stall_is_the_same_stall():
    """Swap mode with a pool too tight for its swapped groups to come back:
    the Python engine stalls, and so does the compiled one, with the same words."""
    trace, config = load_trace(None, 15), config_of(num_gpu_blocks=400, preemption_mode="swap")
    config = replace(config, num_samples=3)
    fast = load_manager_class("fast")
    with pytest.raises(SimulationStalledError) as python:
        run_simulation(trace, fast, config)
    with pytest.raises(SimulationStalledError) as compiled:
        run_compiled(trace, fast, replace(config, engine="compiled"))
    assert str(python.value) == str(compiled.value)


@pytest.mark.slow
@pytest.mark.skipif(not CONVERSATION.exists(), reason=f"needs the conversation trace at {CONVERSATION}")
@pytest.mark.parametrize(
    ("requests", "time_scale", "changes"),
    [
        (2_000, 1.0, {}),
        (2_000, 1.0, {"enable_prefix_caching": False}),
        (1_000, 1.0, {"preemption_mode": "swap", "num_gpu_blocks": 12_000}),
        (1_000, 1.0, {"num_samples": 3}),
        (1_000, 4.0, {}),
    ],
)
def test_the_listed_configurations_in_full(requests, time_scale, changes):
    """Issue #41's list at its sizes, on the production trace (minutes each)."""
    scheduler = {k: v for k, v in changes.items() if k in ("enable_prefix_caching", "preemption_mode")}
    config = config_of(num_gpu_blocks=changes.get("num_gpu_blocks", 49_152), **scheduler)
    config = replace(config, num_samples=changes.get("num_samples", 1))
    assert_twins(scale_arrivals(load_trace(CONVERSATION, requests), time_scale), config)


# -- what it takes and refuses ---------------------------------------------------------------------
def test_only_fast_runs_compiled_and_auto_picks_it_only_there():
    fast, reference = load_manager_class("fast"), load_manager_class("reference")
    assert resolve("auto", fast, "auto") == "compiled"
    assert resolve("auto", fast, "rows") == "python"
    assert resolve("auto", reference, "auto") == "python"
    with pytest.raises(InvalidArgumentError, match="--engine: the compiled engine runs fast's kernels"):
        resolve("compiled", reference, "auto")
    with pytest.raises(InvalidArgumentError, match="--step calls"):
        resolve("compiled", fast, "calls")
    with pytest.raises(InvalidConfigError, match="engine must be one of"):
        SimulationConfig(10, 0, engine="rust")
    with pytest.raises(InvalidConfigError, match="fast's kernels"):
        run_compiled(load_trace(None, 2), reference, SimulationConfig(100, 0, engine="compiled"))


def test_progress_is_reported_and_reaches_every_request():
    seen: list[int] = []
    trace = load_trace(None, 12)
    result = replay(trace, load_manager_class("fast"), replace(config_of(), engine="compiled"), on_progress=seen.append)
    assert seen and seen == sorted(seen) and seen[-1] == len(trace)
    assert result.config.engine == "compiled"


@pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="times the compiled loop")
def test_the_start_up_is_reported_apart_from_the_replay():
    result = run_compiled(load_trace(None, 5), load_manager_class("fast"), replace(config_of(), engine="compiled"))
    assert result.metrics.startup_s > 0 and result.metrics.wall_s > 0


def test_the_command_compares_the_two_engines(tmp_path, capsys):
    """``--compare fast@compiled,fast@rows``: identical decisions, and the
    ratio of the two replays' wall times (a compiled step has no manager time apart)."""
    argv = ["--compare", "fast@compiled,fast@rows", "--max-requests", "20", "--num-gpu-blocks", "1200",
            "--out", str(tmp_path), "--quiet", "--no-plot"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "identical" in printed and "wall time of the replay FastBlockSpaceManager (compiled) /" in printed
    document = json.loads((tmp_path / "simulation.json").read_text())
    assert [run["engine"] for run in document["runs"]] == ["compiled", "python"]


# -- keys made from chunk ids -----------------------------------------------------------------
def edge_trace() -> list[TraceRequest]:
    """Prompts around the chunk edges: a token, a chunk less one, a chunk, a
    chunk and one, two chunks, and a last partial chunk of every length mod 16."""
    lengths = [1, 15, 16, 17, 511, 512, 513, 1023, 1024, 1025, 1500, *range(2 * 512 + 1, 2 * 512 + 17)]
    chunks = [tuple((i * 7 + c) % 5 for c in range(-(-n // 512))) for i, n in enumerate(lengths)]
    return [TraceRequest(i, 0.0, n, 5, ids) for i, (n, ids) in enumerate(zip(lengths, chunks))]


def random_trace(seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 4 * 512) for _ in range(30)]
    chunks = [tuple(rng.randrange(6) for _ in range(-(-n // 512))) for n in lengths]
    return [TraceRequest(i, 0.0, n, 5, ids) for i, (n, ids) in enumerate(zip(lengths, chunks))]


def block_contents(manager, keys: np.ndarray) -> list[tuple[int, ...]]:
    """What each key of a row stands for: its block's tokens, and that its
    parent is the row's previous key (the root for the first): content,
    whatever numbers the two key tables gave it."""
    table = manager.store.keys
    for index, key in enumerate(keys.tolist()):
        assert table.parent[key] == (keys[index - 1] if index else -1)
    return [tuple(table.tokens[key].tolist()) for key in keys.tolist()]


@pytest.mark.parametrize("block_size", [1, 16, 48, 64, 100, 512])
@pytest.mark.parametrize("name", ["the sample", "random traces", "the chunk edges"])
def test_keys_made_from_chunk_ids_are_the_token_paths_block_for_block(name, block_size):
    """The compiled engine keys a prompt's full blocks from token ids it
    makes from the chunk ids (``tokens.write_tokens``), never a token list;
    fast's manager keys them from the list a ``Sequence`` holds. Block for
    block, the two keys stand for the same content (the same tokens, after
    the same parent): block sizes that divide a chunk and those that do
    not, the last partial chunk and its partial block alike."""
    from blockspace import Sequence
    from blockspace.fast import table as T
    from blockspace.fast import tracker as K
    from blockspace.fast.manager import FastBlockSpaceManager

    trace = {"the sample": lambda: load_trace(None, 40 if block_size > 1 else 8),
             "random traces": lambda: random_trace(block_size), "the chunk edges": edge_trace}[name]()  # fmt: skip
    by_list = FastBlockSpaceManager(block_size, 100_000, 0, enable_caching=True)
    by_chunks = FastBlockSpaceManager(block_size, 100_000, 0, enable_caching=True)
    requests, chunks = S.new_requests(trace, 1, None)
    store = by_chunks.store
    out = np.zeros(max(entry.input_length for entry in trace) + block_size, np.int64)
    for r, entry in enumerate(trace):
        seq = Sequence(r, entry.prompt_token_ids())
        by_list.get_num_cached_tokens(seq)
        row = by_list.tracker.tracked[r]
        num_full = entry.input_length // block_size
        tokens = write_tokens(requests, chunks, r, 0, num_full * block_size, out)  # as blocks.num_cached_tokens
        store.tracker = K.grow_tracker(store.tracker, num_rows=r + 1, num_cols=num_full + 1)
        K.open_row(store.tracker_ref, r)
        while (
            K.num_cached_tokens(store.gpu_ref, store.keys_ref, store.tracker_ref, r, tokens, num_full, 0, -1, False)
            == T.NO_KEY_ROOM
        ):
            by_chunks.key_space.make_room(num_full)
        listed = by_list.store.tracker.keys[row, : by_list.store.tracker.num_keys[row]]
        made = store.tracker.keys[r, : store.tracker.num_keys[r]]
        assert len(made) == len(listed) == num_full
        assert block_contents(by_chunks, made) == block_contents(by_list, listed), (name, block_size, r)


@pytest.mark.parametrize("block_size", [1, 16, 48, 64, 100, 512])
@pytest.mark.parametrize("name", ["the sample", "random traces", "the chunk edges"])
def test_the_traces_keys_are_fast_keys_block_for_block(name, block_size):
    """``trace_keys.block_key`` gives two full prompt blocks one key exactly
    when fast's key table, keying their tokens, gives them one; on a replica
    that gets the requests in another order (a fleet's) as well."""
    from blockspace import Sequence
    from blockspace.fast.manager import FastBlockSpaceManager

    trace = {"the sample": lambda: load_trace(None, 40 if block_size > 1 else 8),
             "random traces": lambda: random_trace(block_size), "the chunk edges": edge_trace}[name]()  # fmt: skip
    manager = FastBlockSpaceManager(block_size, 100_000, 0, enable_caching=True)
    requests, chunks = S.new_requests(trace, 1, None)
    nodes, num_nodes = TK.chunk_nodes(chunks, requests.chunk_lo, requests.prompt_len)
    per_node = TK.keys_per_node(block_size)
    order = list(range(len(trace)))
    random.Random(block_size).shuffle(order)
    node_key, numbered = np.full(num_nodes, -1, np.int32), 0
    for r in order:  # as a replica numbers the requests routed to it (engine.Run.take)
        positions = TK.prompt_positions(requests.chunk_lo[r : r + 1], requests.prompt_len[r : r + 1])
        numbered = TK.number_nodes(node_key, nodes, positions, numbered, per_node)
        manager.get_num_cached_tokens(Sequence(r, trace[r].prompt_token_ids()))
    fast_of, trace_of = {}, {}
    for r in order:
        row = manager.tracker.tracked[r]
        keys = manager.store.tracker.keys[row, : manager.store.tracker.num_keys[row]].tolist()
        assert len(keys) == trace[r].input_length // block_size
        for index, key in enumerate(keys):
            mine = int(TK.block_key(node_key, nodes, int(requests.chunk_lo[r]), index, block_size))
            assert 0 <= mine < numbered * per_node, (name, block_size, r, index)
            assert fast_of.setdefault(mine, key) == key, (name, block_size, r, index)
            assert trace_of.setdefault(key, mine) == mine, (name, block_size, r, index)
