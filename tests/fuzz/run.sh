#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (+ASan/UBSan) and runs each
# for a bounded time: `bash tests/fuzz/run.sh [seconds]` (default 30): the
# message decoder, then a mailbox queue's reader (and its frames' decoding).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-30}
out=build/fuzz
mkdir -p "$out/corpus"
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Icsrc tests/fuzz/fuzz_decode.cpp csrc/batchcast/protocol/message.cpp -o "$out/fuzz_decode"
# Seed with one valid message of every kind (each checked to decode below).
"$out/fuzz_decode" -runs=0 "$out/corpus" >/dev/null 2>&1 || true
python3 - "$out/corpus" <<'PY'
import pathlib, re, struct, sys
d = pathlib.Path(sys.argv[1])
VERSION = int(re.search(r"kVersion = (\d+);", pathlib.Path("csrc/batchcast/protocol/message.h").read_text())[1])
head = lambda kind, version=VERSION: struct.pack("<IHH", 0x54534342, version, kind)
text = lambda s: struct.pack("<I", len(s)) + s
host_ring = struct.pack("<iQB", 5, 4096, 0)
gpu_ring = (struct.pack("<iQB", -1, 4096, 1) + b"\x5a" * 16 + struct.pack("<B", 1) + b"\x01" * 64
            + struct.pack("<I", 2) + b"\x02" * 128)
seeds = {
    "hello": head(1) + struct.pack("<qIq", 42, 1, 64) + text(b"") + struct.pack("<iiqqqQ", 0, 0, -1, 0, 0, 0),
    "hello-group": head(1) + struct.pack("<qIq", 42, 2, 8) + text(b"g") + struct.pack("<iiqqqQ", 1, 2, 3, 40, 8, 77),
    "welcome": head(2) + struct.pack("<qQ", 42, 77) + host_ring + struct.pack("<QqqqqiBq", 1, 0, 100, 13, 8, 2, 0, 0)
        + text(b"DataLoader") + struct.pack("<qiiq", 0, 1, 1, 0),
    "welcome-gpu": head(2) + struct.pack("<qQ", 42, 77) + gpu_ring + struct.pack("<QqqqqiBq", 1, 0, -1, -1, 8, 0, 0, 0)
        + text(b"") + struct.pack("<qiiq", -1, 2, 1, 0),
    "refuse": head(3, 7) + text(b"no"),
    "announce": head(4) + struct.pack("<qqQiiqq", 0, 1, 2, -1, 1, 2, 0) + text(b"[]") + struct.pack("<I", 2)
        + struct.pack("<BBB", 1, 6, 2) + struct.pack("<qqQ", 2, 3, 64)
        + struct.pack("<BBI", 2, 1, 2) + text(b"a") + text(b"bc") + struct.pack("<I", 0),
    "announce-indexed": head(4) + struct.pack("<qqQiiqq", 0, 1, 2, -1, 1, 2, 0) + text(b"[]") + struct.pack("<I", 1)
        + struct.pack("<BBB", 1, 6, 1) + struct.pack("<qQ", 2, 64) + struct.pack("<Iqq", 2, 17, 4),
    "epoch_end": head(5) + struct.pack("<qqq", 0, 10, 2),
    "failed": head(6) + struct.pack("<q", 0) + text(b"ValueError: x") + struct.pack("<B", 0),
    "finished": head(7) + struct.pack("<qB", 2, 0),
    "release": head(9) + struct.pack("<IQQ", 2, 1, 2),
    "bye": head(10),
    "ring": head(11) + gpu_ring,
    "evicted": head(12) + text(b"too slow"),
    "unmapped": head(13),
    "status-request": head(14),
    "status": head(15) + text(b'{"name":"x"}'),
    "mapped": head(16),
    "group-ready": head(17) + struct.pack("<qBqq", 1, 1, 64, 0),
    "group-broken": head(18) + struct.pack("<q", 1) + text(b"rank 1 left"),
    "mailbox": head(19) + struct.pack("<iQQQii", 7, 4096 + 2048, 1024, 1024, 8, 9),
}
for k, v in seeds.items():
    (d / k).write_bytes(v)
(d.parent / "seeds.txt").write_text("\n".join(str(d / k) for k in seeds))
PY
clang++ -std=c++17 -O1 -Icsrc tests/fuzz/decode_seeds.cpp csrc/batchcast/protocol/message.cpp -o "$out/decode_seeds"
xargs "$out/decode_seeds" < "$out/seeds.txt"
# The mailbox reader, seeded with queues of valid records (indices, then bytes).
mkdir -p "$out/mailbox-corpus"
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Icsrc tests/fuzz/fuzz_mailbox.cpp csrc/batchcast/mailbox/frame_queue.cpp \
  csrc/batchcast/protocol/message.cpp -o "$out/fuzz_mailbox"
python3 - "$out/mailbox-corpus" "$out/corpus" <<'PY'
import struct, sys, pathlib
out, messages = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
FRAME, MARKER, PADDING = 0x46524d31, 0x4d524b31, 0x50414431
def record(kind, body=b""):
    return struct.pack("<II", len(body), kind) + body + b"\0" * (-len(body) % 8)
for i, m in enumerate(sorted(messages.iterdir())[:24]):
    body = m.read_bytes()
    q = record(FRAME, body) + record(MARKER) + record(FRAME, body)
    q += record(PADDING, b"\0" * 8)
    (out / f"queue-{i}").write_bytes(struct.pack("<QQ", len(q), 0) + q + b"\0" * 64)
PY
# Both fuzzers at once (each is one thread): the mailbox's corpus is made of
# the decoder's seeds above, before the decoder's fuzzer grows that corpus.
"$out/fuzz_decode" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$out/corpus" \
  >"$out/fuzz_decode.log" 2>&1 &
decode=$!
status=0
"$out/fuzz_mailbox" -max_total_time="$seconds" -max_len=4200 -print_final_stats=1 "$out/mailbox-corpus" \
  >"$out/fuzz_mailbox.log" 2>&1 || status=$?
wait "$decode" || status=$?
for f in fuzz_decode fuzz_mailbox; do
  echo "== $f"
  tail -n 12 "$out/$f.log"
done
exit "$status"
