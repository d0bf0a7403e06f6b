"""Transit lists: no message is lost between a queue and kombu's `unacked` hash.

kombu's Redis transport takes a message off its queue with BRPOP and only then records it as
unacknowledged (kombu 5.7.0, kombu/transport/redis.py: `Channel._brpop_read`, then `QoS.append`); a
worker killed in between (SIGKILL, OOM, a Redis shutdown whose last reply the worker read but could
not acknowledge) held the only copy. A genfleet worker's channel takes it with BLMOVE onto its own
transit list instead, and moves it from there into `unacked` in one transaction
(`workers/broker.py`): the message is always in a queue, a transit list or `unacked`.

This module is the one writer of the transit lists' registry (`common/keys.py`, `TRANSITS`) and,
besides those channels, of the lists. Each worker process names its open channels' lists on its
reaper's beat (`renew`); a list whose worker stopped naming it for a lease TTL belongs to a dead
consumer, and the reaper (`return_stranded`, under its fleet-wide lock) puts its messages back at the
head of their queue, unless kombu already holds them as unacked (the worker died after recording the
message, before its transit copy was dropped: cannot happen with the transaction, kept as a guard).
"""
from __future__ import annotations

import logging
import threading
import time

import redis

from common import kombu_wire
from common.keys import KOMBU_UNACKED, TRANSITS, queue_list, transit_queue

log = logging.getLogger(__name__)

_open: set[str] = set()  # this process's channels' transit lists
_lock = threading.Lock()


def register(client: redis.Redis, key: str) -> None:
    """A channel's list, named before its first BLMOVE, so that the reaper can find it."""
    client.zadd(TRANSITS, {key: time.time()})
    with _lock:
        _open.add(key)


def forget(key: str) -> None:
    """The channel closed: its list is no longer renewed; whatever it holds goes back to its queue
    once it has lapsed."""
    with _lock:
        _open.discard(key)


def renew(client: redis.Redis) -> None:
    """This process is alive: each of its open channels' lists is, too."""
    with _lock:
        keys = list(_open)
    if keys:
        now = time.time()
        client.zadd(TRANSITS, dict.fromkeys(keys, now))


def return_stranded(client: redis.Redis, ttl_s: float) -> int:
    """Puts back on their queue the messages of every transit list not renewed for `ttl_s`; drops
    those lists. Returns how many messages went back."""
    lapsed = client.zrangebyscore(TRANSITS, "-inf", time.time() - ttl_s)
    returned = 0
    for raw_key in lapsed:
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        returned += _return_list(client, key)
    return returned


def _return_list(client: redis.Redis, key: str) -> int:
    returned = 0

    def transaction(pipe: redis.client.Pipeline) -> None:
        nonlocal returned
        items = pipe.lrange(key, 0, -1)  # newest first (BLMOVE pushes on the left)
        held = [pipe.hexists(KOMBU_UNACKED, _delivery_tag(item)) for item in items]
        pipe.multi()
        back = [item for item, is_held in zip(items, held, strict=True) if not is_held]
        if back:  # RPUSH: next in line (consumers pop from the right), oldest first
            pipe.rpush(queue_list(transit_queue(key)), *reversed(back))
        pipe.delete(key)
        pipe.zrem(TRANSITS, key)
        returned = len(back)

    client.transaction(transaction, key)
    if returned:
        log.warning("put %d message(s) back on queue %s: taken off it by a consumer that died before "
                    "recording them (%s)", returned, transit_queue(key), key)
    return returned


def _delivery_tag(raw: bytes) -> str:
    try:
        return str(kombu_wire.decode_queued(raw).get("properties", {}).get("delivery_tag", ""))
    except ValueError:  # not kombu's JSON: it goes back to its queue all the same
        return ""
