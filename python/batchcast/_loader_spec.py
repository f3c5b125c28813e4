"""`batchcast serve PATH.py:FUNCTION -- ARGS`: the user's loader, made by
calling FUNCTION in PATH.py, imported as `python PATH.py` would."""

from __future__ import annotations

import collections.abc
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from ._cli_error import CliError, article, describe


def load_function(spec: str) -> tuple[Callable[..., Any], str]:
    """'path/to/file.py:function' -> (the function, its name)."""
    path_text, sep, function = spec.rpartition(":")
    if not sep or not path_text or not function:
        raise CliError(f"'{spec}' is not PATH.py:FUNCTION (a Python file, a colon, the name of "
                       "a function in it that returns the loader)", 2)
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise CliError(f"no such file: {path_text}", 2)
    path = path.resolve()
    module_name = path.stem
    if not module_name.isidentifier() or module_name in sys.modules:  # never shadow a module
        module_name = "_batchcast_serve_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"cannot import {path_text}: not a Python source file", 2)
    module = importlib.util.module_from_spec(module_spec)
    # As `python PATH.py` would: the file's folder first on sys.path (its
    # neighbours import), and the module registered under its own name, so
    # that DataLoader workers started with spawn can unpickle what it defines.
    sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:
        raise CliError(f"importing {path_text} called sys.exit({exc.code!r})") from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CliError(f"importing {path_text} raised {describe(exc)}") from exc
    target = getattr(module, function, None)
    if target is None:
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        listing = f" (it defines: {', '.join(defined)})" if defined else ""
        raise CliError(f"{path_text} has no function '{function}'{listing}", 2)
    if not callable(target):
        raise CliError(f"'{function}' in {path_text} is {article(target)}, not a function", 2)
    return target, function


def make_loader(function: Callable[..., Any], label: str, args: tuple[str, ...],
                 epochs: int | None) -> Any:
    try:
        loader = function(*args)
    except SystemExit as exc:
        raise CliError(f"{label}({', '.join(map(repr, args))}) called sys.exit({exc.code!r})") \
            from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CliError(f"{label}({', '.join(map(repr, args))}) raised {describe(exc)}") from exc
    if loader is None:
        raise CliError(f"{label} returned None (a missing return?); it must return a DataLoader "
                       "or another iterable of batches")
    if not hasattr(loader, "__iter__"):
        raise CliError(f"{label} returned {article(loader)}, which is not iterable; it "
                       "must return a DataLoader or another iterable of batches")
    if isinstance(loader, collections.abc.Iterator) and epochs != 1:
        raise CliError(f"{label} returned {article(loader)}, an iterator that can be "
                       "iterated only once; return a DataLoader, a list or another re-iterable "
                       "object, or serve a single epoch (--epochs 1)")
    return loader
