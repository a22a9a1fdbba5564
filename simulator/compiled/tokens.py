"""A request's token ids, made when a kernel needs them: the compiled twin
of ``workloads.prompt_token_ids`` and ``workloads.output_token_id``.

Why made, not stored: a prompt's tokens are a function of its chunk ids and
offsets, a generated token one of (request, sample, position). The Python
engine builds each prompt as a list; this engine writes into one scratch
buffer only the tokens of the blocks a kernel keys, and never the rest
(``tests/test_compiled_tokens.py`` holds the two equal).
"""

from __future__ import annotations

from numba import njit

from blockspace.workloads import CHUNK_TOKENS, MIX_INCREMENT, MIX_MASK, MIX_MULTIPLIER, OUTPUT_HALF


@njit(cache=True, inline="always")
def mix(x):
    return (x * MIX_MULTIPLIER + MIX_INCREMENT) & MIX_MASK


@njit(cache=True, inline="always")
def output_token(request_index, sample, position):
    x = (request_index * 1_000_003 + sample * 65_537 + position * 2_654_435_761) % OUTPUT_HALF
    return mix(OUTPUT_HALF + x)


@njit(cache=True, inline="always")
def prompt_token(chunks, chunk_lo, position):
    """Prompt token ``position`` of the request whose chunk ids start at ``chunks[chunk_lo]``."""
    return mix(chunks[chunk_lo + position // CHUNK_TOKENS] * CHUNK_TOKENS + position % CHUNK_TOKENS)


@njit(cache=True, inline="always")
def write_tokens(requests, chunks, r, start, end, out):
    """Tokens ``start`` up to ``end`` of request ``r`` into ``out[:end - start]``."""
    prompt_len, chunk_lo = requests.prompt_len[r], requests.chunk_lo[r]
    for position in range(start, end):
        if position < prompt_len:
            out[position - start] = prompt_token(chunks, chunk_lo, position)
        else:
            out[position - start] = output_token(requests.trace_index[r], requests.sample[r], position - prompt_len)
    return out[: end - start]
