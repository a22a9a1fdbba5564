"""The ``blockspace`` command's conventions (issue #24): ``--version``, usage
errors on stderr, ``--help`` without the extras, every option's help with
its default, the notice while the fast kernels compile, and the pytest
plugin's unknown profile as a usage error of the whole run."""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
from importlib.metadata import version

import pytest
from numba import config as numba_config
from numba import njit
from numba.core import event as numba_event

from blockspace import compile_notice, extras
from blockspace.cli import CLOSED_PIPE
from blockspace.cli import main as blockspace
from blockspace.kit_options import PROFILES, build_parser


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_version_is_the_installed_package_version(capsys):
    assert blockspace(["--version"]) == 0
    assert capsys.readouterr().out == f"blockspace {version('blockspace')}\n"


@pytest.mark.parametrize("argv", [["nosuch"], [], ["--nosuch"]])
def test_a_wrong_or_missing_command_is_a_usage_error_on_stderr(capsys, argv):
    assert blockspace(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = one_error_line(captured.err)
    assert "simulate, bench, conformance" in err and (not argv or repr(argv[0]) in err)


def test_help_goes_to_stdout(capsys):
    assert blockspace(["--help"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: blockspace {simulate,") and captured.err == ""


def test_conformance_help_needs_no_extra(monkeypatch, capsys):
    """Without Hypothesis (or any module of the extra) the help is shown, the
    same as with it; running still names the extra."""
    real = extras.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name in extras.EXTRAS["conformance"] else real(name))
    assert blockspace(["conformance", "--help"]) == 0
    captured = capsys.readouterr()
    assert captured.out == build_parser().format_help() and captured.err == ""
    assert "--impl NAME" in captured.out and "--shrink-budget" in captured.out
    assert blockspace(["conformance", "--impl", "fast"]) == 2
    assert "pip install 'blockspace[conformance]'" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["soak", "bench", "gpu-bench"])
def test_every_command_with_an_extra_shows_its_help_without_it(monkeypatch, capsys, command):
    """As for conformance: the options are read from a module that needs no
    extra, and running still names the extra."""
    from blockspace.cli import SUBCOMMANDS

    extra = SUBCOMMANDS[command].extra
    real = extras.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name in extras.EXTRAS[extra] else real(name))
    assert blockspace([command, "--help"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"usage: blockspace {command}") and "--json" in captured.out and captured.err == ""
    assert blockspace([command]) == 2
    assert f"pip install 'blockspace[{extra}]'" in one_error_line(capsys.readouterr().err)
    module = SUBCOMMANDS[command].help_from.partition(":")[0]  # and it truly imports none of the extra
    check = f"import sys, {module}; print(sorted(set({extras.EXTRAS[extra]!r}) & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_every_conformance_option_says_its_default_and_the_help_is_plain():
    parser = build_parser()
    options = [action for action in parser._actions if action.dest != "help"]
    assert len(options) == 15
    for action in options:
        assert action.help, action.option_strings
        assert "default" in action.help or action.required, action.option_strings
    text = parser.format_help()
    assert "``" not in text and all(name in text for name in PROFILES)


# -- numpy's huge pages ------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "advised"), [(None, "False"), ("1", "True")])
def test_a_command_keeps_numpy_from_advising_huge_pages_unless_told(tmp_path, given, advised):
    """``blockspace.cli.HUGE_PAGES``: a replay in a fresh process runs with
    numpy's huge-page advice off; a user who set the variable keeps theirs."""
    environ = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    script = (
        "from blockspace.cli import main\n"
        f"assert main(['simulate', '--max-requests', '3', '--engine', 'python', '--no-plot', '--quiet', "
        f"'--out', {str(tmp_path)!r}]) == 0\n"
        "from numpy._core import multiarray\n"
        "print(multiarray._get_madvise_hugepage())"
    )
    env = environ if given is None else {**environ, "NUMPY_MADVISE_HUGEPAGE": given}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.splitlines()[-1] == advised


# -- the notice while the fast kernels compile -------------------------------------------------
needs_jit = pytest.mark.skipif(bool(numba_config.DISABLE_JIT), reason="NUMBA_DISABLE_JIT: nothing compiles")


@needs_jit
def test_the_notice_comes_once_at_the_first_compile_of_the_watched_package():
    said, other = io.StringIO(), io.StringIO()
    watched = compile_notice.CompileNotice(said, package=__name__)
    unwatched = compile_notice.CompileNotice(other)  # blockspace.fast: nothing of it compiles here

    @njit  # no cache: it compiles on every run of the test
    def add_one(x):
        return x + 1

    with (
        numba_event.install_listener("numba:compile", watched),
        numba_event.install_listener("numba:compile", unwatched),
    ):
        assert add_one(1) == 2 and add_one(1.5) == 2.5  # two compiles, one notice
    assert said.getvalue() == compile_notice.NOTICE + "\n" and other.getvalue() == ""


def blockspace_simulate(tmp_path, **env: str) -> subprocess.Popen:
    """``blockspace simulate`` on three requests with the fast manager, the JIT on."""
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"}
    command = [sys.executable, "-m", "blockspace.cli", "simulate", "--max-requests", "3", "--no-plot", "--quiet",
               "--out", str(tmp_path / "out")]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**environ, **env})


def test_a_cold_kernel_cache_is_announced_when_the_compiling_starts(tmp_path):
    """An empty Numba cache (``NUMBA_CACHE_DIR``): the notice comes on stderr
    as the kernels start compiling (the run is stopped there)."""
    run = blockspace_simulate(tmp_path, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    said = []
    try:
        for line in run.stderr:
            said.append(line)
            if line == compile_notice.NOTICE + "\n":
                break
    finally:
        run.kill()
        run.communicate()
    assert said and said[-1] == compile_notice.NOTICE + "\n", said


def test_a_warm_kernel_cache_says_nothing(tmp_path):
    blockspace_simulate(tmp_path).communicate()  # fills the cache if it was cold
    second = blockspace_simulate(tmp_path)
    out, err = second.communicate()
    assert second.returncode == 0 and out, err
    assert compile_notice.NOTICE not in err


def test_every_run_of_a_command_listens_with_the_one_listener(capsys):
    for _ in range(2):
        assert blockspace(["conformance", "--impl", "json:JSONDecoder"]) == 2
    listeners = [
        one for one in numba_event._registered["numba:compile"] if isinstance(one, compile_notice.CompileNotice)
    ]
    assert listeners == [compile_notice.watch()]


# -- the pytest plugin -------------------------------------------------------------------------
def test_an_unknown_blockspace_profile_stops_the_whole_pytest_run(tmp_path):
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        str(tmp_path),
        "--blockspace-profile",
        "bogus",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "--blockspace-profile: unknown conformance profile 'bogus' (known: quick, full" in done.stderr
    assert "passed" not in done.stdout  # nothing ran with the default profile


def test_a_reader_that_stops_early_gets_no_traceback_and_every_file(tmp_path):
    """``blockspace simulate | head -1``: when the pipe closes, the command
    says nothing on stderr, still writes every file (the plot comes after
    the summary it could no longer print), and exits with the closed pipe's
    own status, 141 (issue #40: it used to stop at once with 1, a failure's
    status, and leave no plot)."""
    command = [sys.executable, "-m", "blockspace", "simulate", "--max-requests", "5", "--quiet"]
    command += ["--out", str(tmp_path)]
    done = subprocess.run(
        f"{' '.join(command)} | head -c 1 > /dev/null; echo $? ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # every line written at once: the pipe closes mid-output
    )  # fmt: skip
    assert done.stderr == "" and done.stdout.split() == ["0", str(CLOSED_PIPE)], (done.stdout, done.stderr)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["simulation.json", "simulation.png"]


def test_a_failure_outranks_the_closed_pipe():
    """A command that fails (1) after its reader has gone keeps its own
    status, not the closed pipe's: here a stand-in command prints more than
    the pipe takes, then fails."""
    script = (
        "import sys, types; import blockspace.cli as cli\n"
        "def main(argv):\n    for i in range(10000): print('line', i)\n    return 1\n"
        "sys.modules['failing'] = types.SimpleNamespace(main=main)\n"
        "cli.SUBCOMMANDS['simulate'] = cli.Subcommand('failing', None, 'prints, then fails')\n"
        "sys.exit(cli.main(['simulate']))\n"
    )
    done = subprocess.run(
        f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} | head -c 1 > /dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.stdout.split() == ["1"] and done.stderr == "", done
