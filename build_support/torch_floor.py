"""Build-time metadata: the oldest torch batchcast runs with.

batchcast's compiled modules use torch's stable ABI only (see CMakeLists.txt),
so one build runs with every torch release from the floor it targets on. This
provider adds `torch>=<floor>` to the wheel's dependencies. The floor is
written once, in CMakeLists.txt (BATCHCAST_TORCH_FLOOR), and read from there.

The build itself compiles against the torch installed in the Python that
builds it, which must be the floor or newer: a build with pip's default build
isolation has no torch, and this provider stops it with the command that works.

Used from pyproject.toml ([[tool.dynamic-metadata]]); no third-party imports
beyond `packaging`, which scikit-build-core itself requires.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

_HOW = (
    "batchcast compiles against the torch installed where it is built (no wheel of "
    "batchcast fits this machine, so pip is building it from source). Install torch and "
    "the build backend first, then build without build isolation: "
    "pip install torch scikit-build-core && pip install --no-build-isolation batchcast "
    "(in a source tree: pip install --no-build-isolation .)"
)


def _floor() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "CMakeLists.txt"), encoding="utf-8") as cmake:
        found = re.search(r'set\(BATCHCAST_TORCH_FLOOR "(\d+\.\d+)"', cmake.read())
    if not found:
        raise RuntimeError("CMakeLists.txt does not set BATCHCAST_TORCH_FLOOR")
    return found.group(1)


def _torch_version() -> str:
    """The torch the build compiles against: this Python's, or that of the
    Python named by BATCHCAST_TORCH_PYTHON (as CMakeLists.txt's option of that
    name: one Python's torch for the wheels of every Python)."""
    from importlib.metadata import PackageNotFoundError, version

    other = os.environ.get("BATCHCAST_TORCH_PYTHON")
    if not other:
        return version("torch")
    import subprocess

    probe = subprocess.run(
        [other, "-c", "from importlib.metadata import version; print(version('torch'))"],
        capture_output=True, text=True)
    if probe.returncode != 0:
        raise PackageNotFoundError(f"torch in BATCHCAST_TORCH_PYTHON={other}: {probe.stderr.strip()}")
    return probe.stdout.strip()


def _check_torch(floor: str) -> None:
    from importlib.metadata import PackageNotFoundError

    from packaging.version import Version

    try:
        installed = Version(_torch_version())
    except PackageNotFoundError:
        raise RuntimeError(
            "torch is not installed in the Python that builds batchcast "
            "(a build with pip's default build isolation has none). " + _HOW
        ) from None
    if installed.release[:2] < Version(floor).release[:2]:
        raise RuntimeError(
            f"batchcast builds against torch {floor} or newer; this Python has torch {installed}"
        )


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, Any]:
    if settings:
        raise RuntimeError(f"torch_floor takes no settings, got {sorted(settings)}")
    floor = _floor()
    _check_torch(floor)
    return {"dependencies": [f"torch>={floor}"]}


def dynamic_wheel(settings: Mapping[str, Any]) -> dict[str, bool]:
    # The check of the build environment's torch makes it a build-time field.
    return {"dependencies": True}
