"""Build-time metadata: pin the torch release batchcast is compiled against.

batchcast._C links libtorch, whose C++ ABI changes with every torch release,
so a wheel built against torch X.Y.Z runs only with torch X.Y.Z. This provider
adds `torch==X.Y.Z` to the wheel's dependencies, read from the torch installed
in the Python that builds it (the one CMake compiles against). The local label
is dropped (2.13.0+cpu pins torch==2.13.0), so CPU and CUDA builds of that
release both satisfy it.

Used from pyproject.toml ([[tool.dynamic-metadata]]); no third-party imports
beyond `packaging`, which scikit-build-core itself requires.
"""

from __future__ import annotations

from typing import Any, Mapping

_HOW = (
    "batchcast compiles against the torch it will run with and pins that release "
    "(no wheel of batchcast fits this machine, so pip is building it from source). "
    "Install torch and the build backend first, then build without build isolation: "
    "pip install torch scikit-build-core && pip install --no-build-isolation batchcast "
    "(in a source tree: pip install --no-build-isolation .)"
)


def _torch_release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        return Version(version("torch")).public
    except PackageNotFoundError:
        raise RuntimeError(
            "torch is not installed in the Python that builds batchcast "
            "(a build with pip's default build isolation has none). " + _HOW
        ) from None


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, Any]:
    if settings:
        raise RuntimeError(f"torch_pin takes no settings, got {sorted(settings)}")
    return {"dependencies": [f"torch=={_torch_release()}"]}


def dynamic_wheel(settings: Mapping[str, Any]) -> dict[str, bool]:
    # The pin comes from the build environment, so an SDist cannot know it.
    return {"dependencies": True}
