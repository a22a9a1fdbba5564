"""The code examples of the docs run as written (README.md has its own test)."""

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def test_the_row_embedding_example_of_the_simulator_docs_runs(capsys):
    text = (DOCS / "simulator-internals.md").read_text()
    section = text.split("## Embedding the fast manager through rows\n", 1)[1]
    section = re.split(r"\n#+ ", section, maxsplit=1)[0]  # up to the next heading, whatever its level
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace: dict = {}
    exec(compile(code, "docs/simulator-internals.md", "exec"), namespace)
    running, manager = namespace["running"], namespace["manager"]
    assert 0 < len(running) < 6  # the pool ran short: the per-call path preempted
    assert namespace["tables"].shape[0] == len(running)
    manager.check_invariants()
    assert "running;" in capsys.readouterr().out
