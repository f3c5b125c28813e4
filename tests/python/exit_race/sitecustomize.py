# Imported at start-up by every Python process of the exit-race test (this
# folder is on its PYTHONPATH), so registered first: its atexit handler runs
# last. In a process with gloo workers it opens shim.cpp's gate and holds the
# GIL until a worker is about to take it: the worker then asks for it after
# the interpreter's last bytecode, as in the race it forces.
import atexit
import ctypes
import os


def _open_gate() -> None:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    if "pt_gloo_runloop" in names:
        ctypes.PyDLL(os.environ["BATCHCAST_EXIT_RACE_SHIM"]).shim_open_gate_and_wait()


if os.environ.get("BATCHCAST_EXIT_RACE_SHIM"):
    atexit.register(_open_gate)
