"""What the command line reports as one line (``batchcast: error: ...``):
the error and how an exception or a value is described in it."""

from __future__ import annotations

from typing import Any

import click


class CliError(click.ClickException):
    """A failure reported as one line: ``batchcast: error: <message>``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        # One per error; click 8.5 declares exit_code a class variable, which
        # type checkers then refuse to assign through an instance.
        vars(self)["exit_code"] = exit_code


def describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def article(value: Any) -> str:
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"
