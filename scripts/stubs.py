"""Writes the constructors of `_C.Producer` and `_C.Consumer` in the stub
(python/batchcast/_C.pyi) from the options the compiled module declares
(`_C.Producer.options()`: the C++ options list, declared once). The tests
check that the stub is current.

    python scripts/stubs.py           # rewrite the stub's constructors
    python scripts/stubs.py --check   # exit 1 (with a diff) if they are out of date
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

STUB = Path(__file__).resolve().parents[1] / "python" / "batchcast" / "_C.pyi"
REQUIRED = {"name"}  # options without a default in Python


def constructor(options: list[tuple[str, str, str]]) -> str:
    lines = ["    def __init__(", "        self,", "        *,"]
    for name, annotation, default in options:
        if name in REQUIRED:
            lines.append(f"        {name}: {annotation},")
            continue
        enum = re.fullmatch(r"<(\w+\.\w+): -?\d+>", default)
        if enum:  # a pybind11 enum: no literal for it in a stub
            lines.append(f"        {name}: {annotation} = ...,  # {enum.group(1)}")
            continue
        if annotation == "str":
            default = json.dumps(ast.literal_eval(default))
        lines.append(f"        {name}: {annotation} = {default},")
    lines.append("    ) -> None: ...")
    return "\n".join(lines)


def render(text: str, core: Any) -> str:
    """The stub's text with each core class's constructor written anew."""
    for cls in ("Producer", "Consumer"):
        pattern = re.compile(rf"(^class {cls}:\n)    def __init__\(\n.*?\n    \) -> None: \.\.\.", re.S | re.M)
        if not pattern.search(text):
            raise SystemExit(f"{STUB}: no constructor of class {cls} found")
        block = constructor(getattr(core, cls).options())
        text = pattern.sub(lambda m: m.group(1) + block, text, count=1)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if the stub is out of date")
    args = ap.parse_args()
    from batchcast._core import _C

    current = STUB.read_text()
    wanted = render(current, _C)
    if wanted == current:
        print(f"{STUB.name}: up to date")
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), wanted.splitlines(True),
                                                   str(STUB), "from the compiled options"))
        print(f"{STUB.name} is out of date: run python scripts/stubs.py")
        return 1
    STUB.write_text(wanted)
    print(f"{STUB.name}: constructors rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
