"""batchcast demo: one producer runs a CPU image pipeline once; three training
processes with different batch sizes train from it and report throughput.

    python examples/demo.py [--samples 3072] [--epochs 2] [--batch-sizes 32 64 100] [--no-compare]

The same as `batchcast demo`; the code is in batchcast/demo.py (installed with
the package). Each consumer checks that it saw every sample exactly once per
epoch, in order.
"""

from batchcast.demo import main

if __name__ == "__main__":
    main()
