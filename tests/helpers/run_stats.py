"""A run's statistics filled without settling rows, for tests: what a finished prompt adds to the
rate buckets, length histogram, partition counts and activity, written with the product's own
`completion_updates` (workers apply the same updates in the script that settles a row)."""
from __future__ import annotations

import redis

from genfleet.common.fleet_stats import completion_updates


def record_completion(client: redis.Redis, run: str, dataset: str, partition: str, completion_tokens: int,
                      seconds: float = 0.0, now: float | None = None) -> None:
    """`completion_updates` on their own, in one pipelined round trip."""
    pipe = client.pipeline(transaction=False)
    for command, key, hash_field, value in completion_updates(run, dataset, partition, completion_tokens, seconds, now):
        if command == "EXPIRE":
            pipe.expire(key, int(value))
        else:
            pipe.execute_command(command, key, hash_field, value)
    pipe.execute()
