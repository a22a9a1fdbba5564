"""The package as a new user meets it: every command either works or names the
extra it needs, no path of our machines in anything we ship, the tools kept
out of the managers and the kit, and the pytest plugin's marker and option.

The fresh-venv checks at the end install the package for real (``-m slow``).
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

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
TOOLS = ("blockspace.simulator", "blockspace.bench", "blockspace.soak")
CORE = [p for p in (ROOT / "blockspace").glob("*.py")]
MANAGERS_AND_KIT = [
    *CORE,
    *(ROOT / "reference").rglob("*.py"),
    *(ROOT / "fast").rglob("*.py"),
    *(ROOT / "conformance").rglob("*.py"),
]


def imported_modules(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


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
