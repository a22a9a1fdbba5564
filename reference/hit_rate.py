"""Prefix-cache hit rate with vLLM's bucketed float arithmetic.

vLLM does not divide hits by queries: it averages completed buckets of 1,000
queries and blends in the running bucket, in IEEE double, in a fixed order.
The result is often a few ulps away from ``hits / queries``; schedulers that
log or compare it see exactly this value (spec §6.7).
"""

from __future__ import annotations

BUCKET = 1000


class HitRate:
    """Hit statistics of one device."""

    def __init__(self) -> None:
        self.num_buckets = 0  # completed buckets
        self.bucket_mean = 0.0  # mean hit rate of the completed buckets
        self.num_queries = 0  # in the running bucket
        self.num_hits = 0  # in the running bucket

    def query(self, hit: bool) -> None:
        self.num_queries += 1
        self.num_hits += hit
        if self.num_queries == BUCKET:
            rate = self.num_hits / self.num_queries
            self.bucket_mean = (self.bucket_mean * self.num_buckets + rate) / (self.num_buckets + 1)
            self.num_queries = self.num_hits = 0
            self.num_buckets += 1

    @property
    def rate(self) -> float:
        fraction = self.num_queries / BUCKET
        total = self.num_buckets + fraction
        if total == 0:
            return 0.0
        done = self.bucket_mean * self.num_buckets if self.num_buckets > 0 else 0.0
        running = (self.num_hits / self.num_queries) * fraction if self.num_queries > 0 else 0.0
        return (done + running) / total

    def state(self) -> tuple[int, float, int, int]:
        return (self.num_buckets, self.bucket_mean, self.num_queries, self.num_hits)
