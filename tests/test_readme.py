"""The README's usage examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_examples_run():
    usage = re.search(r"## Usage\n(.*?)\n## ", README.read_text(), re.S).group(1)
    blocks = re.findall(r"```python\n(.*?)```", usage, re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for code in blocks:  # in order, in one namespace, as a reader would paste them
        exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["block_tables"].shape == (8, 7) and len(namespace["slots"]) == 8
