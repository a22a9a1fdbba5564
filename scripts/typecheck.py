"""Type-check the package with mypy, as CI does: ``python scripts/typecheck.py [mypy options]``.

Why a script and not plain ``mypy``: pyproject.toml maps subpackages onto
folders of their own (``[tool.setuptools.package-dir]``: ``blockspace.reference``
is ``reference/``, ``blockspace.fast`` is ``fast/``, ``blockspace.conformance``
is ``conformance/``). The editable install finds them through an import hook,
which mypy does not run, so plain mypy sees ``blockspace/`` without them and
reports every import of one as missing.

This script lays the package out as it is installed: a tree of symbolic links
to the real files in the folder that ``mypy_path`` of ``[tool.mypy]`` names
(``build/mypy/``), made again on every run so that a new module is never left
out. It then runs mypy from the repository root with the settings of
``[tool.mypy]`` (what to check, how strictly) plus the options given here, and
names every file in mypy's report by its path in the repository. Its exit
status is mypy's: 0 clean, 1 errors found, 2 mypy could not run.

Once the tree exists, plain ``mypy`` checks the same modules, but names the
files by their paths in the tree.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = "$MYPY_CONFIG_FILE_DIR"  # how [tool.mypy] names the folder of pyproject.toml


def tree_folder(mypy_config: dict[str, object]) -> Path:
    """The tree's folder, relative to the root: ``mypy_path`` of ``[tool.mypy]``,
    which must be one folder inside the repository."""
    path = mypy_config.get("mypy_path")
    if not isinstance(path, str) or not path.startswith(CONFIG_DIR + "/"):
        raise SystemExit(f"error: [tool.mypy] mypy_path must be {CONFIG_DIR}/<folder>, got {path!r}")
    return Path(path.removeprefix(CONFIG_DIR + "/"))


def wanted_links(package_dir: dict[str, str], tree: Path) -> dict[Path, Path]:
    """Every link of the tree -> the file or folder it stands for (both
    relative to the root). A package mapped in ``package_dir`` is a real
    folder of the tree holding a link to each entry of its folder, except
    entries that are subpackages mapped elsewhere: those are folders of
    their own. Any other subpackage is one link to its folder."""
    links: dict[Path, Path] = {}
    for package, folder in package_dir.items():
        parent = package.rpartition(".")[0]
        if parent and parent not in package_dir:
            raise SystemExit(f"error: {package} is mapped, but its parent package {parent} is not")
        mapped_children = {p.rpartition(".")[2] for p in package_dir if p.rpartition(".")[0] == package}
        for entry in sorted(Path(folder).iterdir()):
            if entry.name not in mapped_children and entry.name != "__pycache__":
                links[tree.joinpath(*package.split("."), entry.name)] = entry
    return links


def sync_tree(tree: Path, links: dict[Path, Path]) -> None:
    """Make ``tree`` hold exactly ``links``, leaving the links that are right
    as they are (a run beside this one may be reading them)."""
    folders = {tree} | {parent for link in links for parent in link.parents if tree in parent.parents}
    for here, dirnames, filenames in os.walk(tree):
        for name in [*dirnames, *filenames]:
            path = Path(here, name)
            if path.is_symlink():
                target = links.get(path)
                if target is None or Path(os.readlink(path)) != Path(os.path.relpath(target, path.parent)):
                    path.unlink(missing_ok=True)
            elif path.is_dir() and path not in folders:
                shutil.rmtree(path)
            elif not path.is_dir():
                path.unlink()
        dirnames[:] = [name for name in dirnames if Path(here, name) in folders]
    for link, target in links.items():
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            try:
                link.symlink_to(os.path.relpath(target, link.parent))
            except FileExistsError:  # made by a run beside this one
                pass


def repository_paths(report: str, package_dir: dict[str, str], tree: Path) -> str:
    """``report`` with each path in the tree replaced by the file's path in the repository."""
    prefixes = {tree.joinpath(*package.split(".")): Path(folder) for package, folder in package_dir.items()}
    for in_tree in sorted(prefixes, key=lambda path: len(path.parts), reverse=True):
        report = report.replace(f"{in_tree}{os.sep}", f"{prefixes[in_tree]}{os.sep}")
    return report


def main(argv: list[str]) -> int:
    os.chdir(ROOT)  # mypy reads pyproject.toml from, and names files relative to, the working folder
    tool = tomllib.loads(Path("pyproject.toml").read_text())["tool"]
    package_dir = tool["setuptools"]["package-dir"]
    tree = tree_folder(tool["mypy"])
    sync_tree(tree, wanted_links(package_dir, tree))

    stdout, stderr, status = api.run(argv)
    sys.stdout.write(repository_paths(stdout, package_dir, tree))
    sys.stderr.write(repository_paths(stderr, package_dir, tree))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
