"""The README's Python examples run as written: each one on its own (a reader
pastes one block, not all of them) and the usage examples in order."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks() -> list[tuple[int, str]]:
    """Every ```python block of the README, with the line it starts on."""
    text = README.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in BLOCK.finditer(text)]


@pytest.mark.parametrize(
    ("line", "code"), python_blocks(), ids=lambda value: f"line {value}" if isinstance(value, int) else ""
)
def test_each_python_block_runs_on_its_own(line, code):
    """In a namespace of its own: every name it uses, it imports."""
    exec(compile(code, f"README.md, the block at line {line}", "exec"), {})


def test_the_readme_has_its_python_blocks():
    assert len(python_blocks()) == 3


def test_readme_usage_examples_run():
    usage = re.search(r"## Usage\n(.*?)\n## ", README.read_text(), re.S).group(1)
    blocks = BLOCK.findall(usage)
    assert len(blocks) == 2
    namespace: dict = {}
    for code in blocks:  # in order, in one namespace, as a reader would paste them
        exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["block_tables"].shape == (8, 7) and len(namespace["slots"]) == 8
