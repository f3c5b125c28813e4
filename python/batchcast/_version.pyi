# The build writes _version.py (pyproject.toml, [[tool.scikit-build.generate]]);
# a source tree that was never built has none, and batchcast._version() says so.
version: str
