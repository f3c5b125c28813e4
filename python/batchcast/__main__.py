"""``python -m batchcast``: the same as the ``batchcast`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
