#!/usr/bin/env bash
# Builds the decoder fuzz target with clang's libFuzzer (+ASan/UBSan) and runs
# it for a bounded time: `bash tests/fuzz/run.sh [seconds]` (default 30).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-30}
out=build/fuzz
mkdir -p "$out/corpus"
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Icsrc tests/fuzz/fuzz_decode.cpp csrc/batchcast/protocol/message.cpp -o "$out/fuzz_decode"
# Seed with one valid message of every kind.
"$out/fuzz_decode" -runs=0 "$out/corpus" >/dev/null 2>&1 || true
python3 - "$out/corpus" <<'PY'
import struct, sys, pathlib
d = pathlib.Path(sys.argv[1])
head = lambda kind: struct.pack("<IHH", 0x54534342, 1, kind)
text = lambda s: struct.pack("<I", len(s)) + s
seeds = {
    "hello": head(1) + struct.pack("<qI", 42, 0),
    "welcome": head(2) + struct.pack("<qiQQqqq", 42, 5, 4096, 1, 0, 100, 8),
    "refuse": head(3) + text(b"no"),
    "announce": head(4) + struct.pack("<qqQq", 0, 1, 2, 2) + text(b"[]") + struct.pack("<I", 2)
        + struct.pack("<BBB", 1, 6, 2) + struct.pack("<qqQ", 2, 3, 64)
        + struct.pack("<BBI", 2, 1, 2) + text(b"a") + text(b"bc"),
    "epoch_end": head(5) + struct.pack("<qqq", 0, 10, 2),
    "failed": head(6) + struct.pack("<q", 0) + text(b"ValueError: x"),
    "finished": head(7) + struct.pack("<q", 2),
    "release": head(9) + struct.pack("<IQQ", 2, 1, 2),
    "ring": head(11) + struct.pack("<iQ", 5, 4096),
}
for k, v in seeds.items():
    (d / k).write_bytes(v)
PY
"$out/fuzz_decode" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$out/corpus" 2>&1 | tail -n 12
