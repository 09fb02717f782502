"""A TCP forwarder in a thread that can be shut like a network outage: `down()` cuts every
open connection and refuses new ones, `up()` lets them through again. Tests point an app at
it to see what happens while Postgres is unreachable and after it comes back."""

from __future__ import annotations

import socket
import threading


class Gate:
    """Forwards 127.0.0.1:<port> to `target` while up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.open = True
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if not self.open:
                client.close()  # refused at once, as by a host that is gone
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def down(self) -> None:
        """Cut every connection through the gate and refuse new ones."""
        self.open = False
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def up(self) -> None:
        self.open = True

    def close(self) -> None:
        self.down()
        self.listener.close()
