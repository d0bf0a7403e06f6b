"""The one codec for Celery task messages as kombu's Redis transport stores them: encoded by the
producer (which pushes them itself, atomically with its bookkeeping: `RunState.publish`), decoded by
`enqueue --recover-lost` (what is queued or held) and by the lease reaper (what to restore).

Relied on, as installed (celery 5.7.0, kombu 5.7.0):
- celery/app/amqp.py, `AMQP.as_task_v2` (protocol 2): headers carry the task id, name and argsrepr;
  the body is `(args, kwargs, embed)`, serialised with the app's serializer (msgpack here).
- kombu/transport/virtual/base.py, `Channel.prepare_message` and `_inplace_augment_message`: the
  stored envelope is `{body, content-encoding, content-type, headers, properties}`, the body
  base64-encoded (`properties.body_encoding`), with `delivery_tag` and `delivery_info` added.
- kombu/transport/redis.py, `Channel._put`: a queue list holds the envelope as JSON (LPUSH, consumed
  with BRPOP; by genfleet's workers with BLMOVE onto a transit list, as is: workers/broker.py);
  `QoS.append`: the `unacked` hash maps a delivery tag to JSON `[envelope, exchange, routing_key]`;
  `QoS.restore_by_tag` / `Channel._do_restore_message`: a restored message is marked `redelivered`
  in its headers and delivery_info and RPUSHed back onto its queue.

Decoding accepts msgpack bodies only: any other content type (pickle above all) is never deserialised,
as the workers' `accept_content` refuses it too (tests/e2e/test_deploy_rehearsal.py).
"""
from __future__ import annotations

import base64
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import msgpack
from celery import Celery
from celery.utils.time import utcoffset

from genfleet.common.keys import KOMBU_UNACKED, TRANSITS, queue_list
from genfleet.common.queues import GENERATE_TASK, PARTITIONS

EVENT_EXCHANGE = "celeryev"
EVENT_ROUTING_KEY = "task.sent"
MSGPACK = "application/x-msgpack"

Envelope = dict[str, Any]


class TaskMessageEncoder:
    """Encodes a task payload as the exact bytes kombu would store for `app.send_task(GENERATE_TASK,
    args=[payload], queue=partition)`. The header and property fields come from Celery itself
    (`app.amqp.create_task_message`, once); only the per-task values (task id, argsrepr, delivery
    tag, body) are filled in per message, which is what makes 5,000 prompts/s possible in Python.
    Also encodes the `task-sent` event Flower listens for."""

    def __init__(self, app: Celery, task_name: str = GENERATE_TASK) -> None:
        sample = app.amqp.create_task_message(
            "0", task_name, args=[{}], kwargs={}, reply_to=app.thread_oid, create_sent_event=True,
            ignore_result=None, argsrepr="", kwargsrepr="{}")
        self._embed = sample.body[2]  # callbacks, errbacks, chain, chord: all None for our tasks
        self._hostname = f"gen{os.getpid()}@{socket.gethostname()}"
        self._clock = app.clock
        self._packer = msgpack.Packer(use_bin_type=True)
        self._uuids = _Uuid4Pool()
        # The documents as Celery and kombu build them, with named slots for the per-task values;
        # rendering fills the slots of a pre-serialised template instead of serialising a dict.
        headers = {**sample.headers, "id": _slot("id"), "root_id": _slot("id"), "argsrepr": _slot("argsrepr")}
        properties = {**sample.properties, "correlation_id": _slot("id"), "delivery_mode": 2,  # persistent
                      "delivery_info": {"exchange": "", "routing_key": _slot("queue")}, "priority": 0,
                      "body_encoding": "base64", "delivery_tag": _slot("tag")}
        self._message = _JsonTemplate({"body": _slot("body"), "content-encoding": "binary",
                                       "content-type": MSGPACK, "headers": headers, "properties": properties})
        self._event_body = _JsonTemplate({
            "hostname": self._hostname, "utcoffset": utcoffset(), "pid": os.getpid(), "clock": _slot("clock"),
            **(sample.sent_event or {}), "uuid": _slot("id"), "root_id": _slot("id"), "args": _slot("argsrepr"),
            "queue": _slot("queue"), "exchange": "", "routing_key": _slot("queue"),
            "timestamp": _slot("timestamp"), "type": "task-sent"})
        self._event = _JsonTemplate({
            "body": _slot("body"), "content-encoding": "utf-8", "content-type": "application/json",
            "headers": {"hostname": self._hostname},
            "properties": {"delivery_mode": 1, "delivery_info": {"exchange": EVENT_EXCHANGE,
                                                                 "routing_key": EVENT_ROUTING_KEY},
                           "priority": 0, "body_encoding": "base64", "delivery_tag": _slot("tag")}})

    def encode(self, payload: dict[str, Any], queue: str, argsrepr: str) -> tuple[str, bytes]:
        """(task id, the queue message as kombu's Redis transport stores it)."""
        task_id = self._uuids.next()
        body = base64.b64encode(self._packer.pack([[payload], {}, self._embed])).decode("ascii")
        return task_id, self._message.render(
            id=f'"{task_id}"', argsrepr=_json(argsrepr), queue=f'"{queue}"', tag=f'"{self._uuids.next()}"',
            body=f'"{body}"').encode("ascii")

    def encode_sent_event(self, task_id: str, queue: str, argsrepr: str) -> bytes:
        """The `task-sent` event Celery publishes with `task_send_sent_event`, as kombu would."""
        event = self._event_body.render(id=f'"{task_id}"', argsrepr=_json(argsrepr), queue=f'"{queue}"',
                                        clock=str(self._clock.forward()), timestamp=repr(time.time()))
        body = base64.b64encode(event.encode("ascii")).decode("ascii")
        return self._event.render(body=f'"{body}"', tag=f'"{self._uuids.next()}"').encode("ascii")


# --- decoding ---------------------------------------------------------------------------------
def decode_queued(raw: bytes | str) -> Envelope:
    """An entry of a queue list (`Channel._put`)."""
    return json.loads(raw)


def decode_unacked(raw: bytes | str) -> tuple[Envelope, str, str]:
    """An entry of the `unacked` hash (`QoS.append`): (envelope, exchange, routing key)."""
    envelope, exchange, routing_key = json.loads(raw)
    return envelope, exchange, routing_key


def task_payload(envelope: Envelope) -> dict[str, Any] | None:
    """The payload (first positional argument) of a genfleet task message; None for any message
    that is not msgpack, or whose first argument is not a payload. Pickle is never deserialised."""
    if envelope.get("content-type") != MSGPACK:
        return None
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = msgpack.unpackb(body, raw=False)
    return args[0] if args and isinstance(args[0], dict) else None


def redelivered(envelope: Envelope) -> str:
    """The envelope marked redelivered and serialised for its queue list, as
    `Channel._do_restore_message` restores it."""
    envelope.setdefault("headers", {})["redelivered"] = True
    envelope.get("properties", {}).get("delivery_info", {})["redelivered"] = True
    return json.dumps(envelope)


# --- encoding helpers -------------------------------------------------------------------------
_json = json.JSONEncoder(ensure_ascii=True).encode  # kombu's JSON is ASCII-escaped too
_SLOT = re.compile(r'"\$\{(\w+)\}"')


def _slot(name: str) -> str:
    return "${" + name + "}"


class _JsonTemplate:
    """A JSON document serialised once, with `"${name}"` strings as slots for JSON-encoded values."""

    def __init__(self, document: dict[str, Any]) -> None:
        parts = _SLOT.split(json.dumps(document))  # kombu's separators: ", " and ": "
        self._names = parts[1::2]
        self._format = "%s".join(part.replace("%", "%%") for part in parts[0::2])

    def render(self, **values: str) -> str:
        return self._format % tuple(values[name] for name in self._names)


class _Uuid4Pool:
    """Random (version 4) UUID strings, drawn from the OS a few thousand at a time: uuid.uuid4() costs
    more per call than all the rest of a message's JSON."""

    def __init__(self, batch: int = 4096) -> None:
        self._batch = batch
        self._ready: Iterator[str] = iter(())

    def next(self) -> str:
        value = next(self._ready, None)
        if value is None:
            self._ready = iter(self._fill())
            value = next(self._ready)
        return value

    def _fill(self) -> list[str]:
        raw = os.urandom(16 * self._batch)
        uuids = []
        for i in range(0, len(raw), 16):
            h = raw[i:i + 16].hex()
            # Version nibble 4 and the RFC 4122 variant bits, as uuid.uuid4() sets them.
            uuids.append(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}")
        return uuids


def held_messages(client: Any, chunk: int = 1000) -> Iterator[Envelope]:
    """Every message Redis holds, along the way one travels (queue lists, transit lists, kombu's
    `unacked`), so that one moving on while this reads is seen twice rather than not at all; a
    restore (backwards) can slip past, once. Reads only, in chunks."""
    transits = [key.decode() if isinstance(key, bytes) else key for key in client.zrange(TRANSITS, 0, -1)]
    for key in [queue_list(queue) for queue in PARTITIONS] + transits:
        for start in range(0, client.llen(key), chunk):
            for raw in client.lrange(key, start, start + chunk - 1):
                yield decode_queued(raw)
    for _tag, raw in client.hscan_iter(KOMBU_UNACKED, count=chunk):
        envelope, _exchange, _routing_key = decode_unacked(raw)
        yield envelope
