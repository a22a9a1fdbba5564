"""The situations registry (conformance/situations.py): held to the spec,
and reached by the explorer where docs/conformance.md says it is."""

from __future__ import annotations

import inspect
import json
import re
import typing
from pathlib import Path

import pytest

from blockspace.conformance import cli
from blockspace.conformance.scope import SCOPES
from blockspace.conformance.situations import (
    BY_NAME,
    FEATURES,
    NEEDS,
    NOT_TRANSITIONS,
    ORDERED_ANSWERS,
    SITUATIONS,
    Transition,
    possible,
    reached,
)
from blockspace.kit_options import PROFILES, STANDARD_SCOPES
from blockspace.reference import ReferenceBlockSpaceManager
from helpers import explored

DOCS = Path(__file__).parents[1] / "docs"
PAIR = {"reference": "reference", "fast": "fast"}


def spec_anchors() -> set[str]:
    """Every section of docs/semantics.md that holds a [verified] claim, and every §14 item."""
    anchors, section = set(), ""
    for line in (DOCS / "semantics.md").read_text(encoding="utf-8").splitlines():
        if heading := re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line):
            section = "§" + heading.group(1)
        if item := re.match(r"- \*\*(14\.\d+) ", line):
            anchors.add("§" + item.group(1))
        elif "[verified" in line.lower() and section and not section.startswith("§14"):  # past the preface
            anchors.add(section)
    return anchors


def documented_table() -> dict[str, tuple[str, set[str], int]]:
    """docs/conformance.md's situation table: name -> (sections, scopes, shallowest depth)."""
    rows = {}
    for line in (DOCS / "conformance.md").read_text(encoding="utf-8").splitlines():
        if match := re.match(r"\| `(\w+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \| (\d+) \| ([^|]+) \|$", line):
            name, sections, _, scopes, depth, _ = match.groups()  # the last: the wrong implementations it kills
            rows[name] = (sections.strip(), set(re.findall(r"`(\w+)`", scopes)), int(depth))
    return rows


def test_every_verified_section_and_surprise_has_a_situation_or_a_reason():
    anchors = spec_anchors()
    assert len(anchors) > 30 and {"§6.3", "§9.7", "§14.1", "§14.23"} <= anchors  # the parse found them
    covered = {section for s in SITUATIONS for section in s.sections} | set(NOT_TRANSITIONS)
    assert sorted(anchors - covered) == []
    assert len(BY_NAME) == len(SITUATIONS)  # names are unique


STATE_HOOKS = {"snapshot", "save_state"}  # the kit's view of the whole state (compared whole), no caller's answer


def answers_that_are_lists() -> set[str]:
    """The yardstick's public methods whose answer, by its annotation, is a
    list, a tuple or a mapping (``BlockIds`` is a list): every answer that
    can carry an order or a mapping."""
    found = set()
    for name, method in inspect.getmembers(ReferenceBlockSpaceManager, inspect.isfunction):
        answer = typing.get_type_hints(method).get("return")
        kind = typing.get_origin(answer) or answer
        if not name.startswith("_") and isinstance(kind, type) and issubclass(kind, (list, tuple, dict)):
            found.add(name)
    return found - STATE_HOOKS


def test_every_answer_that_carries_an_order_has_a_situation_of_two_elements():
    """Alloy's rule for scopes: every output must be able to hold two of
    anything, or a wrong order passes (issue #51: swaps in reverse order,
    every swap scope of one CPU block). A new list-valued answer fails this
    until ``ORDERED_ANSWERS`` names its situation (and the table, a scope)."""
    answers = answers_that_are_lists()
    assert {"swap_out", "swap_in", "get_block_table", "get_cross_block_table"} <= answers  # the walk finds them
    assert answers == set(ORDERED_ANSWERS)
    assert {shape.situation for shape in ORDERED_ANSWERS.values()} <= set(BY_NAME)


def snapshot_of(tables: dict[int, list[int]], device: str = "GPU") -> dict:
    blocks = [(1, False, False, -1.0)] * 8
    return {"tables": {seq: {"blocks": ids, "num_tokens": 2 * len(ids), "device": device, "last_access": None}
                       for seq, ids in tables.items()}, "cross_tables": {}, "blocks": blocks, "null_block": None,
            "free": {"GPU": [], "CPU": []}, "evictable": {"GPU": [], "CPU": []}, "touched": [],
            "hit_stats": {"GPU": (0, 0.0, 0, 0), "CPU": (0, 0.0, 0, 0)}, "tracker": {}}  # fmt: skip


def shape_reached(method: str, answer: object, tables: dict[int, list[int]] | None = None) -> bool:
    """Whether ``method``'s shape situation is reached by a move that
    answered ``answer`` (a swap moving ``tables`` from one device to the other)."""
    devices = ("CPU", "GPU") if method == "swap_in" else ("GPU", "CPU")
    before, after = (snapshot_of(tables or {}, device) for device in devices)
    move = Transition((method,), before, after, ((method, answer, ""),), 2, None, True)
    return ORDERED_ANSWERS[method].situation in reached(move)


@pytest.mark.parametrize("method", [m for m in ORDERED_ANSWERS if not m.startswith("swap")])
def test_a_shape_situation_is_reached_by_two_different_elements_not_by_one(method):
    """Two elements that differ, so that their order shows; from the move's
    answer, and for a table answer also from the state after, whose every
    table the explorer asks (``protocol.observe``)."""
    one, same, two = [(0, 4)], [(0, 4), (0, 4)], [(0, 4), (1, 5)]
    if method.startswith("get_"):
        one, same, two = [3], [7, 7], [3, 1]  # same: a window's null blocks
    assert [shape_reached(method, answer) for answer in (one, same, two, "")] == [False, False, True, False]
    after = snapshot_of({1: [3, 1]})
    after["cross_tables"] = {"r0": [4, 5]}
    seen = reached(Transition(("admit", "r0", 0), snapshot_of({}), after, (), 2, None, True))
    assert {"table_two_blocks", "cross_table_two_blocks"} <= set(seen)


@pytest.mark.parametrize("method", ["swap_out", "swap_in"])
def test_a_swap_shows_an_order_only_with_a_table_of_two_blocks(method):
    """A swap's pairs come table by table: two tables of one block each
    (``ReversedSwapOrder`` passes there), or one block shared by two
    sequences, show no order within a table."""
    assert shape_reached(method, [(0, 4), (1, 5)], {1: [0, 1]})
    assert not shape_reached(method, [(0, 4), (1, 5)], {1: [0], 2: [1]})
    assert not shape_reached(method, [(0, 4), (0, 5)], {1: [0], 2: [0]})
    assert not shape_reached(method, [], {1: [0, 1]})  # refused: nothing moved


def test_the_table_in_the_docs_lists_every_situation_with_its_sections():
    table = documented_table()
    assert set(table) == set(BY_NAME)
    for name, (sections, scopes, _) in table.items():
        assert sections == ", ".join(BY_NAME[name].sections), name
        assert scopes and scopes <= set(STANDARD_SCOPES), name


def test_a_situation_is_sought_in_every_scope_the_table_says_reaches_it():
    """``NEEDS`` spares a scope the situations it cannot reach; every scope
    that reached one (the table, from the standard set's run) has its needs."""
    assert set(NEEDS) <= set(BY_NAME) and {need for needs in NEEDS.values() for need in needs} == set(FEATURES)
    for name, (_, scopes, _) in documented_table().items():
        for scope in scopes:
            assert BY_NAME[name] in possible(SCOPES[scope]), (name, scope)
    assert len(possible(SCOPES["plain_single"])) < len(possible(SCOPES["default"])) < len(SITUATIONS)


def test_the_standard_set_has_a_scope_of_every_family():
    assert PROFILES["exhaustive"].scopes == STANDARD_SCOPES
    assert {SCOPES[name].family for name in STANDARD_SCOPES} == {"plain", "caching", "sliding_window", "swap",
                                                                   "encoder_decoder"}  # fmt: skip


@pytest.mark.parametrize("name", ["default", "swap_single", "sliding_window_single", "encoder_decoder_single"])
def test_a_scope_reaches_what_the_table_says_at_the_depth_it_says(name):
    """Each situation the table gives this scope, this scope reaches; where
    the table's shallowest depth is this scope's, at that depth."""
    report = explored(name)
    assert report.exhausted and report.passed, report.failure
    for situation, (_, scopes, depth) in documented_table().items():
        assert (situation in report.situations) == (name in scopes), situation
        if name in scopes:
            assert report.situations[situation] >= depth, situation


def test_a_situation_is_found_from_the_values_of_the_moves_calls():
    before = {"tables": {}, "cross_tables": {}, "blocks": [(1, False, False, -1.0)] * 3, "null_block": None,
              "free": {"GPU": [], "CPU": []}, "evictable": {"GPU": [], "CPU": []}, "touched": [],
              "hit_stats": {"GPU": (0, 0.0, 0, 0), "CPU": (0, 0.0, 0, 0)}, "tracker": {}}  # fmt: skip
    swap = Transition(("swap_out", "r0"), before, before, (("swap_out", [(0, 3), (0, 4)], ""),), 2, None, False)
    assert {"swap_out", "swap_unshares"} <= set(reached(swap)) and "swap_out_two_blocks" not in reached(swap)
    refused = Transition(("swap_out", "r0"), before, before, (("can_swap_out", True, ""), ("swap_out", None,
                         "NoFreeBlocksError")), 2, None, False)  # fmt: skip
    assert "swap_out_fails_after_ok" in reached(refused) and "swap_out" not in reached(refused)


@pytest.mark.slow
def test_the_standard_set_is_exhausted_and_reaches_every_situation(tmp_path):
    """``--profile exhaustive`` with no other option (about 10 minutes on two cores)."""
    path = tmp_path / "report.json"
    assert cli.main(["--impl", "fast", "--profile", "exhaustive", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert sorted(report["situations"]["scopes_exhausted"]) == sorted(STANDARD_SCOPES)
    assert report["situations"]["not_reached"] == []
