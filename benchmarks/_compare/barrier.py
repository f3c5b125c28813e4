"""Start barrier and control channel between the driver and the processes of
one configuration: a Unix socket, one JSON line per message.

Each participant connects and says `ready` when it is set up (imports done,
loader built, consumer joined); the driver sends `go` (with its start time)
to all once every participant is ready, and later may send `end` (stop now and
report what you have: a deadline, or a producer that will send nothing more).
A participant may send `done` when it has finished serving.
Everything waits on the socket (an event), never on a timer.
"""

from __future__ import annotations

import json
import os
import socket
import threading


class Client:
    def __init__(self, path: str, role: str):
        self.role = role
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.go: dict | None = None
        self._go = threading.Event()
        self._end: dict | None = None
        self._on_end = None
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="barrier", daemon=True).start()

    def _read(self) -> None:
        for line in self.sock.makefile("r"):
            message = json.loads(line)
            if message["kind"] == "go":
                self.go = message
                self._go.set()
            elif message["kind"] == "end":
                self._ended(message)
        self._go.set()  # the driver went away
        self._ended({"kind": "end", "reason": "driver gone"})

    def _ended(self, message: dict) -> None:
        """Runs the callback on its own thread: a later `end` (a deadline) must
        still get through while an earlier one waits for the stream to drain."""
        with self._lock:
            self._end, callback = message, self._on_end
        if callback is not None:
            threading.Thread(target=callback, args=(message,), daemon=True).start()

    def send(self, kind: str, **fields) -> None:
        line = json.dumps({"kind": kind, "role": self.role, "pid": os.getpid(), **fields}) + "\n"
        with self._lock:
            self.sock.sendall(line.encode())

    def ready(self, **fields) -> None:
        self.send("ready", **fields)

    def wait_go(self) -> dict:
        """Blocks until the driver's `go`; returns it (`t_go`: the driver's
        time.perf_counter(), CLOCK_MONOTONIC, comparable across processes)."""
        self._go.wait()
        if self.go is None:
            raise SystemExit(f"{self.role}: the driver went away before the start")
        return self.go

    def on_end(self, callback) -> None:
        """callback(message) runs on the reader thread when the driver sends
        `end` (or goes away), at once if that already happened."""
        with self._lock:
            self._on_end, ended = callback, self._end
        if ended is not None:
            threading.Thread(target=callback, args=(ended,), daemon=True).start()


class Server:
    """The driver's side: accepts participants, tells them to go, can end them."""

    def __init__(self, path: str):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.conns: list[socket.socket] = []
        self.buffers: dict[int, bytes] = {}
        self.ready: dict[str, dict] = {}  # role -> its ready message
        self.roles: dict[int, str] = {}  # fileno -> role

    def fds(self) -> list:
        return [self.listener, *self.conns]

    def handle(self, readable) -> list[dict]:
        """Processes readable sockets (from select); returns the messages read."""
        messages = []
        for s in readable:
            if s is self.listener:
                conn, _ = self.listener.accept()
                self.conns.append(conn)
                self.buffers[conn.fileno()] = b""
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.conns.remove(s)
                s.close()
                continue
            buf = self.buffers[s.fileno()] + data
            *lines, buf = buf.split(b"\n")
            self.buffers[s.fileno()] = buf
            for line in lines:
                m = json.loads(line)
                if m["kind"] == "ready":
                    self.ready[m["role"]] = m
                    self.roles[s.fileno()] = m["role"]
                messages.append(m)
        return messages

    def broadcast(self, kind: str, roles=None, **fields) -> None:
        line = (json.dumps({"kind": kind, **fields}) + "\n").encode()
        for conn in list(self.conns):
            if roles is not None and self.roles.get(conn.fileno()) not in roles:
                continue
            try:
                conn.sendall(line)
            except OSError:
                pass

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
