"""Starts the tests' worker processes from an interpreter that has already
imported torch, by fork: each worker then starts in milliseconds instead of
the 2-3 s of CPU that `import torch` costs on a small machine, which was most
of the Python suite's time.

    python launcher.py SOCKET      (conftest.py starts it, one per test run)

It imports torch (not batchcast: batchcast reads its environment at import and
installs fork hooks, so each worker imports it itself, as a fresh interpreter
would) and then serves, single-threaded, on a Unix socket. A request is one
JSON line: {"argv": [script, args...] or ["-m", module, args...], "env": {...}, "cwd": ..., "stdout":
path, "stderr": path}. The launcher forks; the child takes the environment,
the working directory, the output files and argv, and runs the script as
`__main__` through runpy, so it ends the way an interpreter ends (a
SystemExit's code, an uncaught exception's traceback and status 1, atexit,
thread joins). The launcher answers {"pid": N} and, when the child ends,
{"returncode": R} (negative: the signal that ended it), as subprocess does.

What differs from a fresh interpreter: torch is imported before the
worker's environment is applied (the tests set none of torch's variables),
and the worker's `__main__` is runpy's module. The tests that are about how
interpreters start, fork and end (test_endings.py, test_forks.py) run fresh
interpreters instead (`fresh_interpreters` marker)."""

from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import socket
import sys


def serve(path: str):
    """Serves until its parent closes stdin; returns the request in a child."""
    import torch  # noqa: F401  (what each worker would otherwise import itself)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(sys.stdin, selectors.EVENT_READ, "parent")
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    os._exit(0)  # the test run ended
            elif key.data == "child":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                while children:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)})
                                         .encode() + b"\n")
                        except OSError:
                            pass
                        conn.close()
            else:
                conn, _ = listener.accept()
                with conn.makefile("rb") as f:
                    request = json.loads(f.readline())
                pid = os.fork()
                if pid == 0:
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.set_wakeup_fd(-1)
                    sel.close()
                    for s in (listener, conn, *children.values()):
                        s.close()
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    return request
                children[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def become(request) -> None:
    """Turns this forked child into the worker the request describes."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["argv"][0] == "-m":
        sys.argv = ["-m", *request["argv"][2:]]  # runpy puts the module's path first
        sys.path[0] = os.getcwd()
    else:
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))


if __name__ == "__main__":
    job = serve(sys.argv[1])
    del serve
    become(job)
    if job["argv"][0] == "-m":
        runpy.run_module(job["argv"][1], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(job["argv"][0], run_name="__main__")
