"""The mutation driver picks its targets right: in a kernel module, only the
lines of the ``@njit`` kernels (``fast``); in the Python layer, only the
lines outside them (``fast-python``)."""

import json
import re

import pytest

from blockspace.conformance.mutation import (
    FAST_KERNELS,
    FAST_PYTHON,
    KERNEL_DECORATORS,
    ROOT,
    TARGETS,
    enumerate_mutants,
    from_report,
    kernel_lines,
)


def test_kernel_lines_are_the_bodies_of_njit_functions_only():
    source = (ROOT / "fast" / "tracker.py").read_text()
    lines = source.splitlines()
    inside = kernel_lines(source)
    kernel = next(i for i, line in enumerate(lines) if line.startswith("def _key_and_count("))
    python = next(i for i, line in enumerate(lines) if line.startswith("def grow_tracker("))
    assert kernel + 1 in inside and kernel not in inside  # the body, not the signature
    assert not any(python <= i < python + 8 for i in inside)  # a plain Python function is left alone


def test_every_fast_kernel_module_is_a_target_and_has_kernels():
    assert TARGETS["fast"] == FAST_KERNELS
    for name in FAST_KERNELS:
        assert kernel_lines((ROOT / name).read_text()), name
    njit_modules = {
        f"fast/{path.name}"
        for path in (ROOT / "fast").glob("*.py")
        if any(f"@{decorator}" in path.read_text() for decorator in KERNEL_DECORATORS)
    }
    # not targets: the handles' constructors, the kernel index (no kernel of its own), the device
    # table's host deltas and its packing next to the CUDA kernel
    assert njit_modules - set(FAST_KERNELS) <= {
        "fast/handles.py",
        "fast/kernels.py",
        "fast/table_deltas.py",
        "fast/device_table.py",
    }


def test_the_python_layer_target_is_every_line_outside_the_kernels():
    pytest.importorskip("mutmut", reason="needs mutmut 2.x for its mutation operators (the dev extra)")
    mutants = enumerate_mutants("fast-python")
    assert {name for name, _ in mutants} == set(FAST_PYTHON)
    for name in FAST_PYTHON:
        inside = kernel_lines((ROOT / name).read_text())
        assert not any(m.line_number in inside for n, m in mutants if n == name), name
    assert not set(FAST_PYTHON) & set(FAST_KERNELS)


def test_a_report_names_its_mutants_again_even_where_a_line_repeats(tmp_path):
    pytest.importorskip("mutmut", reason="needs mutmut 2.x for its mutation operators (the dev extra)")
    mutants = enumerate_mutants("fast")
    texts = [(name, m.line.strip(), m.index) for name, m in mutants]
    repeated = [item for item in mutants if texts.count((item[0], item[1].line.strip(), item[1].index)) > 1]
    assert repeated, "the sample has no line text twice in a file: this test would prove nothing"
    chosen = repeated[1::2]
    records = [{"file": name, "line": m.line.strip(), "index": m.index, "line_number": m.line_number + 1,
                "verdict": "survived"} for name, m in chosen]  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps({"results": records}))
    assert from_report(str(tmp_path / "report.json"), mutants, survivors_only=True) == chosen


def test_an_exhaustive_run_cut_by_the_timeout_is_no_kill(tmp_path):
    """Under the quick profile a run past the timeout is a hang, a kill; the
    exhaustive profile's survivors take minutes, so its cut runs count as
    survived, said so."""
    from blockspace.conformance.mutation import build_workdir, run_mutant

    build_workdir(tmp_path)
    name = "reference/rules.py"
    unchanged = (ROOT / name).read_text()
    assert run_mutant(tmp_path, name, unchanged, timeout=2, profile="exhaustive")[::2] == (
        "survived",
        "not killed in 2 s",
    )
    assert run_mutant(tmp_path, name, unchanged, timeout=2, profile="quick")[::2] == ("killed", "timeout")


@pytest.mark.slow
def test_on_a_fresh_sample_of_mutants_the_exhaustive_profile_kills_what_quick_kills(tmp_path):
    """Mutants of the reference core drawn anew each run (the seed is in the
    message, to run one again): each that the quick profile kills, the
    exhaustive profile kills too (issue #51). The catalogue of broken
    managers is held to this in every run
    (``tests/test_conformance_broken.py``); fresh mutants take minutes each."""
    pytest.importorskip("mutmut", reason="needs mutmut 2.x for its mutation operators (the dev extra)")
    import random

    from blockspace.conformance.mutation import build_workdir, mutated_source, run_mutant, sources_in

    seed = random.randrange(2**32)
    build_workdir(tmp_path)
    for name, mutation_id in random.Random(seed).sample(enumerate_mutants("reference", sources_in(tmp_path)), 3):
        source = mutated_source(name, mutation_id, sources_in(tmp_path))
        quick = run_mutant(tmp_path, name, source, timeout=600, profile="quick")
        if quick[0] == "killed":
            exhaustive = run_mutant(tmp_path, name, source, timeout=1800, profile="exhaustive")
            assert exhaustive[0] == "killed", (seed, name, mutation_id.line, quick, exhaustive)


def test_the_guides_count_each_targets_mutants_as_the_tool_does():
    pytest.importorskip("mutmut", reason="needs mutmut 2.x for its mutation operators (the dev extra)")
    for guide in ("conformance.md", "conformance-internals.md"):
        text = (ROOT / "docs" / guide).read_text()
        for target in ("reference", "fast", "fast-python"):
            start = text.index(f"`--target {target}`")
            entry = text[start : text.find("`--target ", start + 1)].split("\n\n")[0]  # its row, or its item
            said = re.search(r"([0-9,]+) mutants", entry)
            assert said, (guide, target)
            assert int(said[1].replace(",", "")) == len(enumerate_mutants(target)), (guide, target)
