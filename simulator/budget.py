"""One step's token and sequence budget (vLLM's ``SchedulingBudget``), and
the rule of how much of it a prompt's chunk may take.

Why its own module: the policy and both step paths (``calls.py``,
``row_step.py``) spend it, so it belongs to none of them. The rule
(``usable_tokens``, ``least_usable``) is written once, here, for both
engines: the Python one calls it, and the compiled one compiles this very
function (``compiled/policy.py``; ``numba_cache.py`` stamps this file with
the compiled ones).

Each request counts once: vLLM keys the additions by request id, so a
group scheduled twice in one step (it cannot be, but a preempted group's
tokens are given back under the same key) is never charged twice.
"""

from __future__ import annotations


def usable_tokens(remaining: int, block_size: int, caching: bool) -> int:
    """The tokens of ``remaining`` budget a prompt's chunk may take: with
    prefix caching whole blocks only, so that a partial prefill never ends
    inside a block (whose content could not be keyed)."""
    return remaining // block_size * block_size if caching else remaining


def least_usable(block_size: int, caching: bool) -> int:
    """The least remaining budget of which ``usable_tokens`` leaves one token
    (a decode's): a whole block with prefix caching."""
    return block_size if caching else 1


class SchedulingBudget:
    """Tokens and sequences of one step; each request counts once."""

    def __init__(self, token_budget: int, max_num_seqs: int) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.num_batched_tokens = 0
        self.num_cached_tokens = 0
        self.num_curr_seqs = 0
        self._token_requests: set[str] = set()
        self._seq_requests: set[str] = set()

    def can_schedule(self, num_new_tokens: int, num_new_seqs: int) -> bool:
        return (
            self.num_batched_tokens + num_new_tokens <= self.token_budget
            and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs
        )

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_num_batched_tokens(self, request_id: str, num_tokens: int, num_cached_tokens: int = 0) -> None:
        if request_id not in self._token_requests:
            self._token_requests.add(request_id)
            self.num_batched_tokens += num_tokens
            self.num_cached_tokens += num_cached_tokens

    def subtract_num_batched_tokens(self, request_id: str, num_tokens: int) -> None:
        if request_id in self._token_requests:
            self._token_requests.remove(request_id)
            self.num_batched_tokens -= num_tokens

    def add_num_seqs(self, request_id: str, num_seqs: int) -> None:
        if request_id not in self._seq_requests:
            self._seq_requests.add(request_id)
            self.num_curr_seqs += num_seqs

    def subtract_num_seqs(self, request_id: str, num_seqs: int) -> None:
        if request_id in self._seq_requests:
            self._seq_requests.remove(request_id)
            self.num_curr_seqs -= num_seqs

    def add_decodes(self, request_ids: list[str]) -> None:
        """One token and one sequence for each request not counted yet (a
        run of single decodes; the sets count the new ones at C speed)."""
        before = len(self._token_requests)
        self._token_requests.update(request_ids)
        self.num_batched_tokens += len(self._token_requests) - before
        before = len(self._seq_requests)
        self._seq_requests.update(request_ids)
        self.num_curr_seqs += len(self._seq_requests) - before


__all__ = ["SchedulingBudget", "least_usable", "usable_tokens"]
