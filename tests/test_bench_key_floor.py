"""``python -m blockspace.bench.key_floor``: the content table's time to key
a trace's prompt blocks, with the distinct contents it found checked."""

from __future__ import annotations

import json

from blockspace.bench.key_floor import main
from blockspace.workloads import load_trace


def distinct_blocks(requests, block_size):
    """Distinct contents: a block is its tokens after its whole prefix."""
    seen = set()
    for request in requests:
        tokens = request.prompt_token_ids()
        for end in range(block_size, len(tokens) + 1, block_size):
            seen.add(tuple(tokens[:end]))
    return len(seen)


def test_it_keys_every_block_once_and_finds_each_again(tmp_path, capsys):
    path = tmp_path / "made" / "keys.json"  # its folder is made
    assert main(["--max-requests", "12", "--block-size", "64", "--json", str(path)]) == 0
    figures = json.loads(path.read_text())
    requests = load_trace(None, 12)
    assert figures["blocks"] == sum(len(r.prompt_token_ids()) // 64 for r in requests)
    assert figures["keys_after_new"] == figures["keys_after_found"] == distinct_blocks(requests, 64)
    assert "into the full table" in capsys.readouterr().out


def test_a_bad_option_is_refused_before_any_work(tmp_path, capsys):
    assert main(["--block-size", "0"]) == 2
    (tmp_path / "file").write_text("")
    assert main(["--json", str(tmp_path / "file" / "x.json")]) == 2
    assert "error:" in capsys.readouterr().err
