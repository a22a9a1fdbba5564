"""The package as a new user meets it: every command either works or names the
extra it needs, no path of our machines in anything we ship, the tools kept
out of the managers and the kit, no module importing itself through others,
and the pytest plugin's marker and option.

The fresh-venv checks at the end install the package for real (``-m slow``).
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
import tomllib
from collections import deque

import pytest

from blockspace import extras
from blockspace.cli import main as blockspace
from blockspace.errors import MissingExtraError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def without(monkeypatch, *modules: str) -> None:
    """Make ``modules`` look uninstalled to the extras check."""
    real = extras.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name in modules else real(name))


def one_error_line(capsys, extra: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    assert f"pip install 'blockspace[{extra}]'" in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("argv", "missing", "extra"),
    [
        (["conformance", "--impl", "fast"], "crosshair", "conformance"),
        (["soak", "--ops", "10"], "hypothesis", "conformance"),
        (["bench", "--quick"], "torch", "bench"),
        (["gpu-bench"], "numba_cuda", "gpu"),
        (["simulate", "--max-requests", "3"], "matplotlib", "sim"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(monkeypatch, capsys, argv, missing, extra):
    without(monkeypatch, missing)
    assert blockspace(argv) == 2
    err = one_error_line(capsys, extra)
    assert missing in err
    assert "replaying" not in capsys.readouterr().out  # nothing ran first


def test_simulate_runs_without_any_extra_when_asked_for_no_plot(monkeypatch, capsys, tmp_path):
    without(monkeypatch, "matplotlib", "rich")
    code = blockspace(["simulate", "--max-requests", "3", "--no-plot", "--quiet", "--out", str(tmp_path)])
    assert code == 0 and (tmp_path / "simulation.json").exists()


def test_the_progress_bar_needs_rich_only_on_a_terminal(monkeypatch, capsys, tmp_path):
    without(monkeypatch, "rich")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert blockspace(["simulate", "--max-requests", "3", "--no-plot", "--out", str(tmp_path)]) == 2
    assert "--quiet" in one_error_line(capsys, "sim")


def test_tensor_answers_without_torch_raise_an_import_error_naming_the_extra(monkeypatch):
    from blockspace.fast import FastBlockSpaceManager
    from blockspace.sequence import SequenceGroup

    manager = FastBlockSpaceManager(4, 8, 0)
    group = SequenceGroup.from_prompt("g", range(6), first_seq_id=0)
    manager.allocate(group)
    before = manager.snapshot()
    without(monkeypatch, "torch")
    for call in (lambda: manager.block_tables(group.seqs), lambda: manager.slot_mapping(group.seqs)):
        with pytest.raises(ImportError, match=r"blockspace\[gpu\]") as raised:
            call()
        assert isinstance(raised.value, MissingExtraError)
    assert manager.snapshot() == before


def test_the_kit_refuses_to_import_without_its_extra(monkeypatch):
    """Importing the kit checks its extra first (a fresh interpreter: the kit
    is already imported in this one)."""
    code = (
        "import importlib.util, blockspace.extras as e\n"
        "real = importlib.util.find_spec\n"
        "e.find_spec = lambda n: None if n == 'hypothesis' else real(n)\n"
        "try:\n"
        "    import blockspace.conformance.suite\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("MissingExtraError ") and "blockspace[conformance]" in out


# -- no path of our machines -----------------------------------------------------------
FORBIDDEN = ["..", "/shared/"], ["/work", "/"], ["/root", "/"], ["/home", "/"], ["shared/", "traces"]


def shipped_files() -> list[pathlib.Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    names = listed.stdout.split() if listed.returncode == 0 else []
    files = [ROOT / name for name in names] or [
        p for p in ROOT.rglob("*") if p.is_file() and not ({".git", ".venv"} & set(p.relative_to(ROOT).parts))
    ]
    return [
        f for f in files if f.suffix in {".py", ".md", ".toml", ".txt", ".cfg", ".json", ".jsonl", ""} and f.is_file()
    ]


def test_nothing_shipped_names_a_path_of_our_machines():
    patterns = ["".join(parts) for parts in FORBIDDEN]  # built here, so this file does not match itself
    found = []
    for path in shipped_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            found += [f"{path.relative_to(ROOT)}:{number}: {p}" for p in patterns if p in line]
    assert not found, "\n".join(found)
    assert len(shipped_files()) > 100  # the walk saw the repository


# -- folders that show the architecture ------------------------------------------------------
TOOLS = ("blockspace.simulator", "blockspace.bench", "blockspace.soak", "blockspace.profile")
CORE = [p for p in (ROOT / "blockspace").glob("*.py")]
MANAGERS_AND_KIT = [
    *CORE,
    *(ROOT / "reference").rglob("*.py"),
    *(ROOT / "fast").rglob("*.py"),
    *(ROOT / "conformance").rglob("*.py"),
]


def imported_modules(path: pathlib.Path, runtime_only: bool = False) -> set[str]:
    """What ``path`` imports anywhere (inside a function too: that is where
    an import circle hides), each as a dotted name: ``import a.b`` gives
    ``a.b``, ``from a import b`` gives ``a.b`` whether ``b`` is a submodule
    or a name defined in ``a`` (the caller knows the modules: see
    ``import_graph``). A relative import keeps its leading dots.
    ``runtime_only`` leaves out the imports under ``if TYPE_CHECKING:``,
    which never run, so they close no circle."""
    names = set()
    nodes: list[ast.AST] = [ast.parse(path.read_text())]
    while nodes:
        node = nodes.pop()
        if runtime_only and isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING:
            nodes += node.orelse
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names |= {f"{base}.{alias.name}" if node.module else f"{base}{alias.name}" for alias in node.names}
        nodes += ast.iter_child_nodes(node)
    return names


TYPE_CHECKING = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


def test_neither_the_managers_nor_the_kit_import_a_tool():
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in MANAGERS_AND_KIT
        for name in imported_modules(path)
        if name.startswith(TOOLS)
    ]
    assert not offenders and len(MANAGERS_AND_KIT) > 40, offenders


def test_the_shared_package_imports_no_manager_and_no_kit():
    """Managers are found by name at run time (``load_manager_class``), never imported by the interface."""
    inner = ("blockspace.conformance", "blockspace.fast", "blockspace.reference")
    offenders = [f"{p.name} imports {n}" for p in CORE for n in imported_modules(p) if n.startswith(inner)]
    assert not offenders, offenders


# -- no import circles -------------------------------------------------------------------------
def package_modules() -> dict[str, pathlib.Path]:
    """Every module of the packages pyproject.toml ships, by its dotted name,
    with its source file. The names come from the package-dir mapping
    (``blockspace.fast`` is ``fast/``), read from pyproject.toml so that a
    new package is covered without touching this test."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setuptools["package-dir"]
    modules = {}
    for package in setuptools["packages"]:
        mapped = max((p for p in dirs if package == p or package.startswith(p + ".")), key=len)
        folder = ROOT / dirs[mapped] / package[len(mapped) :].lstrip(".").replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Which of ``modules`` each one imports when it runs. A name stands for
    the longest of its prefixes that is a module: ``from blockspace.fast
    import kernels`` runs ``blockspace.fast.kernels``, ``from
    blockspace.fast.rules import cdiv`` runs ``blockspace.fast.rules``,
    ``from blockspace import Device`` runs the package's ``__init__``."""

    def module_of(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    return {
        module: {found for name in imported_modules(path, runtime_only=True) if (found := module_of(name)) != module}
        - {""}
        for module, path in modules.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The shortest circle through each module that is on one, as
    ``[a, b, ..., a]`` starting from its first module in name order, each
    circle once."""
    cycles = set()
    for start in graph:
        cycle = shortest_circle(graph, start)
        if cycle:
            turn = cycle.index(min(cycle))
            cycles.add(tuple(cycle[turn:] + cycle[:turn]))
    return [[*cycle, cycle[0]] for cycle in sorted(cycles)]


def shortest_circle(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The modules on a shortest way from ``start`` back to it (breadth
    first: the first module met that imports ``start`` ends the shortest)."""
    came_from = {start: start}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        if start in graph[module]:
            path = [module]
            while path[-1] != start:
                path.append(came_from[path[-1]])
            return path[::-1]
        for following in sorted(graph[module] - came_from.keys()):
            came_from[following] = module
            queue.append(following)
    return None


def test_no_module_of_the_package_imports_itself_through_others():
    """A circle works only in the order Python happens to meet it (and an
    import inside a function merely hides one): none in any package shipped."""
    modules = package_modules()
    graph = import_graph(modules)
    relative = sorted(f"{m} imports {n}" for m in modules for n in imported_modules(modules[m]) if n.startswith("."))
    assert not relative, f"relative imports, which this graph would not see: {relative}"
    cycles = import_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)
    assert {"blockspace.fast.rules", "blockspace.conformance.check", "blockspace.simulator"} <= graph.keys()
    assert "blockspace.conformance.check" in graph["blockspace.conformance.runner"]  # the graph does see imports


def test_the_import_graph_sees_function_level_imports_and_not_type_checking_ones(tmp_path):
    files = {
        "a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.c\ndef f():\n    from pkg import b\n",
        "b": "import pkg.a\n",
        "c": "from pkg.a import f\nfrom pkg import missing\n",
        "d": "import typing\nif typing.TYPE_CHECKING:\n    from pkg import e\nelse:\n    from pkg import c\n",
        "e": "from pkg import d\n",
    }
    modules = {f"pkg.{name}": tmp_path / f"{name}.py" for name in files}
    for name, source in files.items():
        modules[f"pkg.{name}"].write_text(source)
    graph = import_graph(modules)
    assert graph == {
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a"},
        "pkg.c": {"pkg.a"},
        "pkg.d": {"pkg.c"},
        "pkg.e": {"pkg.d"},
    }
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    graph["pkg.a"] |= {"pkg.e"}  # a longer circle through a: a -> e -> d -> c -> a, beside a -> b -> a
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.a", "pkg.e", "pkg.d", "pkg.c", "pkg.a"]]


# -- the pytest plugin --------------------------------------------------------------------------
def test_the_plugin_marks_the_kit_tests_and_its_option_picks_the_profile(tmp_path):
    (tmp_path / "test_mine.py").write_text(
        "from blockspace.conformance.suite import ManagerConformance\n"
        "class TestMine(ManagerConformance):\n"
        "    impl = 'reference'\n"
        "def test_other():\n"
        "    pass\n"
    )
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path / "test_mine.py")]
    env = dict(os.environ, PYTHONPATH="")
    selected = subprocess.run(
        [*run, "--collect-only", "-m", "blockspace_conformance"], capture_output=True, text=True, env=env
    )
    assert "TestMine::test_interface" in selected.stdout and "test_other" not in selected.stdout, selected.stdout
    assert "PytestUnknownMarkWarning" not in selected.stdout + selected.stderr
    wrong = subprocess.run(
        [*run, "-k", "test_trace_replay", "--blockspace-profile", "nonesuch"], capture_output=True, text=True, env=env
    )
    assert wrong.returncode == 4 and "unknown conformance profile 'nonesuch'" in wrong.stderr  # a usage error


# -- a fresh venv, installed for real (slow: it installs NumPy, Numba, torch) -------------------
def venv_with(tmp_path: pathlib.Path, spec: str) -> pathlib.Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "-c", str(ROOT / "constraints.txt")]
    subprocess.run([*pip, spec], check=True, cwd=tmp_path)
    return venv / "bin"


@pytest.mark.slow
def test_a_plain_install_runs_every_command_or_names_its_extra(tmp_path):
    """``pip install .``, no extras, run outside the checkout."""
    bin_dir = venv_with(tmp_path, str(ROOT))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / "blockspace"), *argv], cwd=elsewhere, capture_output=True, text=True)

    ran = run("simulate", "--max-requests", "20", "--no-plot", "--quiet")
    assert ran.returncode == 0 and "requests finished" in ran.stdout, ran.stderr
    for argv, extra in [
        (("simulate", "--max-requests", "20"), "sim"),
        (("conformance", "--impl", "fast"), "conformance"),
        (("conformance", "--help"), "conformance"),
        (("soak", "--ops", "100"), "conformance"),
        (("bench", "--quick"), "bench"),
        (("gpu-bench",), "gpu"),
    ]:
        done = run(*argv)
        assert done.returncode == 2 and f"blockspace[{extra}]" in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    python = str(bin_dir / "python")
    imported = subprocess.run([python, "-c", "import blockspace.fast, blockspace.reference"], cwd=elsewhere)
    assert imported.returncode == 0


@pytest.mark.slow
def test_an_installed_kit_runs_its_trace_check(tmp_path):
    """``pip install '.[test,sim]'``, not editable, run outside the checkout:
    the kit finds the sample it ships and the trace check passes."""
    bin_dir = venv_with(tmp_path, f"{ROOT}[test,sim]")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "BLOCKSPACE_TRACE"}
    done = subprocess.run(
        [str(bin_dir / "blockspace"), "conformance", "--impl", "fast", "--only", "trace", "--json", str(report)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    checks = json.loads(report.read_text())["checks"]
    assert [(c["name"], c["status"]) for c in checks] == [
        ("trace[mooncake]", "passed"),
        ("trace[mooncake-rows]", "passed"),
    ], checks


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` runs when imported, itself left out (its parent packages' ``__init__`` aside)."""
    seen, queue = set(), deque([start])
    while queue:
        for following in graph[queue.popleft()] - seen:
            seen.add(following)
            queue.append(following)
    return seen


def test_the_two_engines_are_peers():
    """The Python engine and its compiled twin share what they share
    through ``simulator.runs``; neither imports the other's modules, even
    through a third (issue #52: the compiled engine imported the Python one's)."""
    graph = import_graph(package_modules())
    python = {f"blockspace.simulator.{name}" for name in ("simulation", "scheduler", "calls", "row_step", "timed")}
    compiled = {name for name in graph if name.startswith("blockspace.simulator.compiled.")}
    packages = {"blockspace", "blockspace.simulator", "blockspace.simulator.compiled"}
    assert python <= graph.keys() and len(compiled) > 5
    for module in compiled:
        assert not reaches(graph, module) & python, (module, sorted(reaches(graph, module) & python))
    for module in python:
        assert not (reaches(graph, module) - packages) & compiled, module
    assert "blockspace.simulator.runs" in graph["blockspace.simulator.compiled.engine"]
