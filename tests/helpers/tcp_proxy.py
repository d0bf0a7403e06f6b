"""A TCP proxy on loopback that can blackhole its traffic: a silent network partition that heals.

Clients connect to the proxy's port; each connection is relayed to the upstream address. While
`blackholed`, nothing is relayed either way and nothing is closed: bytes wait, as TCP retransmits
through a partition, and reach the other side once it heals. A client's own timeouts are what
notice (genfleet's workers set none on Redis: their calls hang). When the upstream closes (Redis
killed), the client's side is closed too; while the upstream is down, new connections are accepted
and closed at once, as a refused connect would be."""
from __future__ import annotations

import contextlib
import socket
import threading

from helpers.sim_process import free_port

CHUNK = 65536


class BlackholeProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._listener.settimeout(0.2)
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    def __enter__(self) -> BlackholeProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._flowing.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.close()

    def blackhole(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._flowing.wait()  # a connect through a partition hangs until it heals
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        with self._lock:
            self._sockets.update((client, server))
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    break
                self._flowing.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._sockets.difference_update((source, target))
