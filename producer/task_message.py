"""Encodes a task payload as the exact bytes kombu's Redis transport would store for
`app.send_task(GENERATE_TASK, args=[payload], queue=partition)`, so the producer can push them itself
(atomically with its bookkeeping, see `publisher.py`) and workers consume them like any Celery task.

The header and property fields come from Celery itself (`app.amqp.create_task_message`, once); only
the per-task values (task id, argsrepr, delivery tag, body) are filled in per message, which is what
makes 5,000 prompts/s possible in Python. Also encodes the `task-sent` event Flower listens for.
"""
from __future__ import annotations

import base64
import json
import os
import re
import socket
import time
from typing import Any

import msgpack
from celery import Celery
from celery.utils.time import utcoffset

from common.queues import GENERATE_TASK

EVENT_EXCHANGE = "celeryev"
EVENT_ROUTING_KEY = "task.sent"


class TaskMessageEncoder:
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
                                       "content-type": "application/x-msgpack", "headers": headers,
                                       "properties": properties})
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
        self._batch, self._ready = batch, iter(())

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
