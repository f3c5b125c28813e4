"""A cached producer on a GPU ring (the simulated device in CI, a real GPU
when there is one), against the same loader uncached: the same batches, and
the cached ones gathered straight into the ring's pinned host mirror.
Run by test_cache.py with BATCHCAST_SIMULATED_CUDA set (or on a GPU):
prints one JSON line."""
import json, os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, batchcast as bc
from test_cache import Decoded, loader_of
if len(sys.argv) > 1 and sys.argv[1] == "serve":
    ds = Decoded(45)
    p = bc.Producer(loader_of(ds, 6, seed=4), sys.argv[2], device="cuda:0", epochs=3,
                    cache=None if sys.argv[3] == "none" else sys.argv[3], linger=5)
    p.run()
    st = p.stats()
    print(json.dumps({"calls": sum(ds.calls.values()), "in_place": st["batches_in_place"],
                      "cache_batches": st.get("cache_batches"), "ring": st["ring_device"]}))
    sys.exit(0)
def run(name, cache):
    srv = subprocess.Popen([sys.executable, __file__, "serve", name, cache], stdout=subprocess.PIPE, text=True)
    got = []
    with bc.Consumer(name, 7, timeout=20, join="next_epoch") as c:
        for _ in range(3):
            got.append([(b["image"].cpu().clone(), ids.tolist()) for b, ids in c.with_indices()])
        dev = (c.stats()["device"], c.stats()["transfer"])
    out, _ = srv.communicate(timeout=60)
    return got, json.loads(out.strip().splitlines()[-1]), dev
a, sa, dev = run("sim-plain", "none")
b, sb, _ = run("sim-cached", "memory")
same = all(len(x) == len(y) and all(torch.equal(i, j) and k == l for (i, k), (j, l) in zip(x, y)) for x, y in zip(a, b))
print(json.dumps({"same": same, "device": dev, "plain": sa, "cached": sb}))
