"""The Python API in one process (producer on a background thread): the
rebatching property over random sizes, structures, lifecycle, errors, leaks."""

from __future__ import annotations

import collections
import dataclasses
import gc
import inspect
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch
from conftest import batchcast_mappings, eventually, open_fds, shm_entries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchcast as bc


def id_batches(n: int, loader_batch: int, width: int = 3):
    """A loader (re-iterable) of (ids, ids*10 as float rows of `width`) batches."""

    class Loader:
        iters = 0

        def __iter__(self):
            Loader.iters += 1
            for start in range(0, n, loader_batch):
                ids = torch.arange(start, min(n, start + loader_batch))
                yield ids, (ids * 10).double().view(-1, 1).repeat(1, width)

    return Loader()


@pytest.mark.every_torch
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    loader_batch=st.integers(1, 40),
    batch_size=st.integers(1, 70),
    n=st.integers(0, 300),
    drop_last=st.booleans(),
    slots=st.integers(2, 6),
)
def test_rebatching_is_exactly_once_for_any_sizes(loader_batch, batch_size, n, drop_last, slots):
    name = f"prop-{loader_batch}-{batch_size}-{n}-{int(drop_last)}-{slots}"
    with bc.Producer(id_batches(n, loader_batch), name, epochs=2, slots=slots,
                     samples_per_epoch=n) as producer:
        consumer = bc.Consumer(name, batch_size=batch_size, drop_last=drop_last, timeout=10)
        want = list(range(n // batch_size * batch_size if drop_last else n))
        expect_len = n // batch_size if drop_last else -(-n // batch_size)
        assert len(consumer) == expect_len
        for _ in range(2):
            seen, sizes = [], []
            for ids, rows in consumer:
                assert torch.equal(rows, (ids * 10).double().view(-1, 1).repeat(1, 3))
                seen += ids.tolist()
                sizes.append(len(ids))
            assert seen == want
            assert len(sizes) == expect_len
            assert all(s == batch_size for s in sizes[:-1])
        consumer.close()
    assert producer.error is None


def test_nested_structures_scalars_and_lists_round_trip(runtime_dir):
    Pair = collections.namedtuple("Pair", ["left", "right"])

    def loader():
        for k in range(3):
            ids = torch.arange(4 * k, 4 * k + 4)
            yield {
                "x": ids.float(),
                "pair": Pair(ids, [f"n{i}" for i in ids.tolist()]),
                "nested": [(ids * 2, {"deep": ids.view(-1, 1, 1).to(torch.int16)})],
                "scores": [float(i) / 2 for i in ids.tolist()],
                "ok": tuple(i % 3 == 0 for i in ids.tolist()),
                "step": 7,
                "label": "train",
                "none": None,
                "scale": torch.tensor(0.5),
            }

    class Loader:
        def __iter__(self):
            return loader()

    with bc.Producer(Loader(), "nested", epochs=1):
        consumer = bc.Consumer("nested", batch_size=5)
        batches = list(consumer)
    assert [len(b["x"]) for b in batches] == [5, 5, 2]
    b = batches[1]
    ids = list(range(5, 10))
    assert b["x"].tolist() == [float(i) for i in ids]
    assert isinstance(b["pair"], tuple) and type(b["pair"]).__name__ == "Pair"
    assert b["pair"].left.tolist() == ids and b["pair"].right == [f"n{i}" for i in ids]
    assert b["nested"][0][0].tolist() == [2 * i for i in ids]
    assert b["nested"][0][1]["deep"].dtype == torch.int16
    assert b["nested"][0][1]["deep"].shape == (5, 1, 1)
    assert b["scores"] == [i / 2 for i in ids]
    assert b["ok"] == tuple(i % 3 == 0 for i in ids)
    assert (b["step"], b["label"], b["none"]) == (7, "train", None)
    assert b["scale"].item() == 0.5 and b["scale"].dim() == 0


def test_announcements_too_large_for_the_mailbox_come_over_the_socket_in_their_place(runtime_dir):
    # Announcements and releases go through the consumer's mailbox in shared
    # memory; one that does not fit there (here: 300 KB of file names) comes
    # over the socket, and still in its place in the stream.
    def loader():
        for k in range(12):
            ids = torch.arange(8 * k, 8 * k + 8)
            width = 40_000 if k % 3 == 1 else 4
            yield ids, [f"{i}".rjust(width, "-") for i in ids.tolist()]

    class Loader:
        def __iter__(self):
            return loader()

    with bc.Producer(Loader(), "spill", epochs=2, slots=4) as producer:
        consumer = bc.Consumer("spill", batch_size=5, timeout=10)
        for _ in range(2):
            ids, names = [], []
            for i, n in consumer:
                ids += i.tolist()
                names += n
            assert ids == list(range(96))
            assert [int(n.lstrip("-")) for n in names] == ids
            assert [len(n) for n in names] == [40_000 if i // 8 % 3 == 1 else 4 for i in ids]
        stats = consumer.stats()
        assert stats["mailbox"] and stats["dropped_messages"] == 0, stats
        consumer.close()
        # Sent before the consumer could take them: counted by now.
        assert producer.stats()["messages_over_socket"] == 2 * 4
    assert producer.error is None


def test_strided_conjugate_and_negative_views_arrive_as_their_values(runtime_dir):
    # The producer copies a plain contiguous tensor with one memcpy; anything
    # else (strides, offsets, lazy conjugate/negative bits) must arrive as the
    # values the loader's tensor stands for, not its raw memory.
    g = torch.Generator().manual_seed(3)
    sent = []
    for _ in range(3):
        base = torch.randn(6, 8, generator=g)
        z = torch.randn(8, 4, dtype=torch.complex64, generator=g)
        sent.append({
            "transposed": base.t()[:6],          # strides (1, 8)
            "stepped": base[:, ::2],             # a gap between elements
            "offset": base[:, 3:],               # storage offset, rows not contiguous
            "conj": z.conj()[:6],                # conjugate bit
            "neg": z.conj().imag[:6],            # negative bit
            "plain": base + 1,
        })
    assert sent[0]["conj"].is_conj() and sent[0]["neg"].is_neg()

    class Loader:
        def __iter__(self):
            return iter(sent)

    with bc.Producer(Loader(), "strided", epochs=1):
        with bc.Consumer("strided", batch_size=6, timeout=10) as consumer:
            got = [{k: v.clone() for k, v in b.items()} for b in consumer]
    assert len(got) == 3
    for want, have in zip(sent, got):
        for key, tensor in want.items():
            assert have[key].dtype == tensor.dtype, key
            assert torch.equal(have[key].resolve_conj().resolve_neg(), tensor.resolve_conj().resolve_neg()), key


@pytest.mark.parametrize("writable", [False, True])
def test_tensors_of_many_dimensions_arrive_with_their_shapes_and_values(runtime_dir, writable):
    # Shapes and strides go to torch with each tensor: a few dimensions are
    # kept inline, more on the heap; views of the ring (writable=False) and
    # copies of their own (writable=True) both, rebatched across loader batches.
    g = torch.Generator().manual_seed(5)
    shapes = {"flat": (), "three": (2, 3), "six": (1, 2, 1, 3, 1), "nine": (2, 1, 1, 2, 1, 1, 3, 1)}
    rows = {k: torch.randn(12, *shape, generator=g) for k, shape in shapes.items()}

    class Loader:
        def __iter__(self):
            for start in range(0, 12, 4):
                yield {k: v[start:start + 4] for k, v in rows.items()}

    with bc.Producer(Loader(), "dims", epochs=1):
        with bc.Consumer(
            "dims",
            batch_size=6,
            timeout=10,
            device=bc.Placement(writable=writable),
        ) as consumer:
            got = list(consumer.with_indices())
    assert [ids.tolist() for _, ids in got] == [list(range(6)), list(range(6, 12))]
    for key, shape in shapes.items():
        parts = [batch[key] for batch, _ in got]
        assert [tuple(p.shape) for p in parts] == [(6, *shape)] * 2, key
        assert torch.equal(torch.cat(parts), rows[key]), key
        assert all(p.is_contiguous() for p in parts), key


CAPSULES = """
import torch, batchcast as bc
assert bc._C.tensor_crossing() == "capsules", bc._C.tensor_crossing()
batches = [(torch.arange(i * 4, i * 4 + 4), torch.arange(i * 12, i * 12 + 12).float().view(4, 3))
           for i in range(12)]
with bc.Producer(batches, "capsules", epochs=3, slots=2):  # 2 slots: freed views must come back
    with bc.Consumer("capsules", batch_size=6, timeout=30) as c:
        for _ in range(3):
            got = [(ids, x) for ids, x in c]
            ids = torch.cat([i for i, _ in got])
            assert ids.tolist() == list(range(48)), ids
            assert torch.equal(torch.cat([x for _, x in got]), torch.arange(48 * 3).float().view(48, 3))
            del got, ids
print("ok")
"""


def test_tensors_cross_as_dlpack_capsules_where_torch_has_no_exchange_api(runtime_dir):
    """The path for a torch without DLPack's C exchange API (every supported
    torch has it; BATCHCAST_DLPACK_CAPSULES takes the other path): the same
    values both ways, and views freed give their ring slots back."""
    expected = "exchange" if hasattr(torch.Tensor, "__dlpack_c_exchange_api__") else "capsules"
    assert bc._C.tensor_crossing() == expected
    env = dict(os.environ, BATCHCAST_DLPACK_CAPSULES="1")
    done = subprocess.run([sys.executable, "-c", CAPSULES], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_the_modules_export_their_init_functions_and_nothing_else():
    """Hidden visibility and a version script: batchcast's classes and the
    C++ library's template copies stay inside each module."""
    import batchcast._status as status

    for module, init in ((bc._C, "PyInit__C"), (status, "PyInit__status")):
        out = subprocess.run(["nm", "-D", "--defined-only", module.__file__], capture_output=True,
                             text=True, check=True).stdout
        assert [line.split()[-1] for line in out.splitlines()] == [init], out[:2000]


def test_tensors_stay_valid_after_the_consumer_and_producer_are_gone(runtime_dir):
    producer = bc.Producer(id_batches(64, 8), "keep", epochs=1, slots=2).start()
    consumer = bc.Consumer("keep", batch_size=8)
    kept = [ids.clone() if i % 2 else ids for i, (ids, _) in enumerate(consumer) if i < 1]
    consumer.close()
    producer.stop()
    gc.collect()
    assert kept[0].tolist() == list(range(8))


def test_batches_are_read_only_views_of_shared_memory(runtime_dir):
    with bc.Producer(id_batches(32, 8), "views", epochs=1):
        consumer = bc.Consumer("views", batch_size=16)
        ids, rows = next(iter(consumer))
        assert consumer.stats()["views"] == 2 and consumer.stats()["copies"] == 0
        # Two loader batches back to back in the ring make one view, not a copy.
        assert ids.data_ptr() + ids.numel() * 8 == ids[8:].data_ptr() + 8 * 8
        del ids, rows
        consumer.close()


def test_producer_waits_for_its_first_consumer_before_loading(runtime_dir):
    loader = id_batches(16, 4)
    with bc.Producer(loader, "lazy", epochs=1) as producer:
        time.sleep(0.5)
        assert type(loader).iters == 0  # nothing loaded while nobody listens
        consumer = bc.Consumer("lazy", batch_size=4)
        assert [ids.tolist() for ids, _ in consumer][0] == [0, 1, 2, 3]
        assert type(loader).iters == 1
        consumer.close()
    assert producer.stats()["batches_published"] == 4


def test_epochs_none_serves_until_stopped_and_each_iter_is_an_epoch(runtime_dir):
    producer = bc.Producer(id_batches(10, 3), "forever", epochs=None).start()
    consumer = bc.Consumer("forever", batch_size=4)
    for _ in range(5):
        assert [ids.tolist() for ids, _ in consumer] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    producer.stop()
    # Stopped mid-epoch: ProducerLost. Stopped between epochs: the epochs already
    # in the ring (a page holds many tiny batches) arrive whole, then the next
    # epoch is one it was stopped before serving: ProducerLost too.
    with pytest.raises(bc.ProducerLost, match="was stopped before"):
        for _ in range(1000):
            epoch = [ids.tolist() for ids, _ in consumer]
            assert epoch == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    consumer.close()


def test_leaving_an_epoch_early_resumes_at_the_next_one(runtime_dir):
    with bc.Producer(id_batches(20, 5), "early", epochs=3):
        consumer = bc.Consumer("early", batch_size=5)
        for k, (ids, _) in enumerate(consumer):
            if k == 1:
                break  # leave epoch 0 after two batches (after one it would be a peek)
        assert [ids.tolist()[0] for ids, _ in consumer] == [0, 5, 10, 15]  # epoch 1, whole
        assert len(list(consumer)) == 4  # epoch 2
        with pytest.raises(bc.EpochsExhausted,
                           match="its iterator of epoch 0 was left after 2 batches"):
            list(consumer)  # no epoch 3
        consumer.close()


def test_a_second_producer_with_the_same_name_is_refused(runtime_dir):
    with bc.Producer(id_batches(4, 2), "taken", epochs=1):
        with pytest.raises(bc.NameInUse, match="already running"):
            bc.Producer(id_batches(4, 2), "taken")
    # Free again once the first is gone.
    bc.Producer(id_batches(4, 2), "taken").close()


def _stubs_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "stubs.py"
    spec = importlib.util.spec_from_file_location("batchcast_stubs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stubs_constructors_are_the_cores_options_declared_once():
    """_C.pyi's constructors are written from the C++ options lists
    (scripts/stubs.py): every option, its type and its default, in order."""
    from pathlib import Path

    from batchcast._core import _C

    stubs = _stubs_script()
    text = (Path(bc.__file__).parent / "_C.pyi").read_text()
    assert stubs.render(text, _C) == text, "_C.pyi is out of date: run python scripts/stubs.py"
    names = [n for n, _, _ in _C.Consumer.options()]
    assert names[:3] == ["name", "batch_size", "drop_last"] and "shared_gpu_views" in names
    assert ("slots", "int", "8") in _C.Producer.options()
    assert ("straggler_timeout", "float | None", "None") in _C.Producer.options()


def test_the_core_refuses_a_bad_option_naming_it(runtime_dir):
    from batchcast._core import _C

    with pytest.raises(TypeError, match=r"batchcast._C.Producer: option slots takes int, not 'eight'"):
        _C.Producer(name="opts", slots="eight")
    with pytest.raises(TypeError, match=r"batchcast._C.Producer has no option 'slotz' \(its options: "
                                        r"name, runtime_dir, slots, "):
        _C.Producer(name="opts", slotz=8)
    with pytest.raises(TypeError, match=r"option batch_size takes int \| None, not 2.5"):
        _C.Consumer(name="opts", batch_size=2.5)
    with pytest.raises(TypeError, match=r"option timeout takes float, not '3'"):
        _C.Consumer(name="opts", timeout="3")
    with pytest.raises(TypeError, match="needs name="):
        _C.Consumer(batch_size=4)
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        _C.Consumer("opts")  # keyword-only


def test_errors_keep_their_types_once_batchcast_status_is_loaded(runtime_dir):
    # Its module (torch-free, for the command line) translates its own errors
    # only: loaded, it must not turn the core's into plain RuntimeErrors.
    import batchcast.status

    with pytest.raises(ValueError, match="name"):
        batchcast.status.list_producers("no/such name")
    with bc.Producer(id_batches(4, 2), "typed", epochs=1):
        with pytest.raises(bc.NameInUse, match="already running"):
            bc.Producer(id_batches(4, 2), "typed")
        (listing,) = batchcast.status.list_producers("typed")
        assert listing["alive"] and listing["status"]["name"] == "typed"
    with pytest.raises(ValueError):  # InvalidArgument, from the core
        bc.Producer(id_batches(4, 2), "bad name/with slash")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "bad/name"}, "invalid producer name"),
        ({"name": ""}, "invalid producer name"),
        ({"name": "ok", "epochs": -1}, "epochs must be"),
        ({"name": "ok", "device": "tpu"}, "is not a device|serves host memory"),
        ({"name": "ok", "device": "meta"}, "serves host memory"),
        ({"name": "ok", "linger": -1}, "linger must be"),
        ({"name": "ok", "slots": 1}, "slots must be at least 2"),
    ],
)
def test_bad_producer_arguments_are_clear_errors(runtime_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        bc.Producer(id_batches(4, 2), **kwargs)


@pytest.mark.skipif(bc.cuda_available(), reason="checks the error on machines without a GPU")
def test_gpu_producer_without_a_gpu_says_why(runtime_dir):
    with pytest.raises(bc.CudaError, match=r"cuda:0: this process sees 0 GPU\(s\)|without its CUDA transport"):
        bc.Producer(id_batches(4, 2), "nogpu", device="cuda:0")
    # The name is free again: nothing was left behind.
    bc.Producer(id_batches(4, 2), "nogpu").close()


def test_consumer_device_must_match_what_the_producer_serves(runtime_dir):
    # Serving until stopped: the refused consumer joined (and left) before it was
    # refused, so the next one starts at whichever epoch comes next.
    with bc.Producer(id_batches(4, 2), "hostonly", epochs=None):
        if not bc.cuda_available():
            with pytest.raises(bc.CudaError, match=r"asked for cuda:0 but this process sees 0 GPU"):
                bc.Consumer("hostonly", batch_size=4, device="cuda:0", timeout=10)
        else:
            with pytest.raises(ValueError, match="serves batches from host shared memory"):
                bc.Consumer("hostonly", batch_size=4, device="cuda:0", timeout=10)
        with bc.Consumer("hostonly", batch_size=4, device="cpu", timeout=10) as c:
            assert [ids.tolist() for ids, _ in c] == [[0, 1, 2, 3]]
            assert c.stats()["transfer"] == "shared-memory" and c.stats()["device"] == "cpu"
            assert c.stats()["ipc_memory_opens"] == 0


def test_a_consumer_joining_a_finished_producer_is_told_there_is_no_epoch(runtime_dir):
    with bc.Producer(id_batches(4, 2), "done", epochs=1) as p:
        with bc.Consumer("done", batch_size=2, timeout=10) as first:
            assert [ids.tolist() for ids, _ in first] == [[0, 1], [2, 3]]
        p._thread.join(10)  # served its one epoch and said Finished
        assert not p._thread.is_alive()
        with bc.Consumer("done", batch_size=2, timeout=10) as late:
            with pytest.raises(bc.EpochsExhausted, match=r"served every epoch it was asked to "
                               r"\(epoch 0\) and ended, and this consumer asked for epoch 1"):
                list(late)
        with bc.Consumer("done", batch_size=2, timeout=10, join=bc.Join(past_last_epoch="empty")) as late:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert list(late) == []  # as asked: an empty epoch, nothing to warn of


def test_a_closed_consumers_batches_stay_valid_while_the_others_go_on(runtime_dir):
    # 40 loader batches of 32 KiB through a ring that holds 9 of them: the
    # batch the closed consumer still holds must not be overwritten while the
    # other consumer takes all 40.
    with bc.Producer(id_batches(160, 4, width=1024), "keep", epochs=1, slots=4,
                     min_consumers=2) as p:
        a = bc.Consumer("keep", batch_size=4, timeout=10)
        b = bc.Consumer("keep", batch_size=4, timeout=10)
        ids, rows = next(iter(a))
        a.close()
        assert sum((x.tolist() for x, _ in b), []) == list(range(160))
        stats = p.stats()
        assert stats["ring_bytes"] < stats["bytes_published"]  # the ring was reused
        assert ids.tolist() == [0, 1, 2, 3]
        assert torch.equal(rows, (ids * 10).double().view(-1, 1).repeat(1, 1024))
        # The producer keeps that one slot for the closed consumer...
        eventually(lambda: [(c["leaving"], c["slots_held"]) for c in p.stats()["consumers"]
                            if c["leaving"]] == [(True, 1)], "the closed consumer to hold one slot")
        del ids, rows
        gc.collect()
        # ...and forgets it once it is freed.
        eventually(lambda: not any(c["leaving"] for c in p.stats()["consumers"]),
                   "the producer to forget the closed consumer")
        b.close()


def ring_allocated_bytes(name: str) -> int:
    """Bytes of memory the kernel holds for the ring named `name` (its memfd,
    open in this process because the producer runs on a thread here)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"/memfd:batchcast:{name}"):
                found.append(os.stat(f"/proc/self/fd/{fd}").st_blocks * 512)
        except OSError:
            pass  # an fd closed while listing
    assert len(found) == 1, f"expected one ring memfd for {name!r}, found {len(found)}"
    return found[0]


def test_joining_allocates_none_of_the_ring_the_producer_has_not_used(runtime_dir):
    # A ring has room for `slots` batches in flight plus `slots` kept ones; the
    # producer touches the first part as it goes and the room for kept batches
    # only when needed. A consumer's mapping must not allocate the rest (a
    # populating mapping of a memfd zero-fills every page, at join: for a
    # ring of 38 MB images, the whole ring before the first batch).
    loader = id_batches(4 * 256, 256, width=512)  # 1 MiB of rows per batch
    with bc.Producer(loader, "lazy", epochs=1, slots=8) as p:
        with bc.Consumer("lazy", batch_size=256, timeout=10) as c:
            ids, rows = next(iter(c))
            assert ids.tolist() == list(range(256))
            assert rows[255, 511].item() == 2550.0
            ring = p.stats()["ring_bytes"]
            assert ring > 16 * 2**20  # 2*8+1 batches of 1 MiB
            allocated = ring_allocated_bytes("lazy")
            # The flow's share is 9 of the 17 batches (53%).
            assert allocated < 0.6 * ring, f"{allocated} of {ring} bytes allocated"
            del ids, rows


def test_a_consumer_done_with_a_finished_producer_lets_go_of_its_ring(runtime_dir):
    # After the last epoch, with its batches freed, a consumer that is still
    # open tells the producer it is done with the ring (a GPU ring may then be
    # freed at once instead of after `linger`).
    with bc.Producer(id_batches(8, 2), "letgo", epochs=1) as p:
        with bc.Consumer("letgo", batch_size=4, timeout=10) as c:
            assert sum((ids.tolist() for ids, _ in c), []) == list(range(8))
            p._thread.join(10)
            eventually(lambda: p.stats()["consumers"] == [], "the consumer to let go of the ring",
                       timeout=5)
            assert p.stats()["leaves"] == 1


def test_bad_consumer_arguments_are_clear_errors(runtime_dir):
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            bc.Consumer("anything", batch_size=bad)


ENDS_WHILE_SERVING = """
import torch, batchcast as bc
class Loader:
    def __iter__(self):
        for start in range(0, 4000, 4):
            ids = torch.arange(start, start + 4)
            yield ids, (ids * 10).double()  # torch work in the producer's thread
producer = bc.Producer(Loader(), "ends", epochs=1, slots=2).start()
consumer = bc.Consumer("ends", batch_size=4)
batch = next(iter(consumer))
print("ending with the producer serving and the consumer open", flush=True)
"""


def test_a_script_that_ends_while_its_background_producer_serves_exits_cleanly(runtime_dir):
    """A notebook or script that never stops its producer: the interpreter
    ends the daemon serving thread as it exits, and a thread ended inside a
    torch or batchcast call used to abort the process ("terminate called
    without an active exception", exit status 134). The producer is stopped
    before that (atexit) and batchcast's calls let such a thread end."""
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", ENDS_WHILE_SERVING], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "ending with the producer serving" in run.stdout
        assert "terminate" not in run.stderr, run.stderr
    assert list(runtime_dir.iterdir()) == []


def test_loader_errors_reach_a_background_producer_and_its_consumers(runtime_dir):
    class Broken:
        def __iter__(self):
            yield torch.arange(4)
            raise KeyError("missing shard 3")

    producer = bc.Producer(Broken(), "broken", epochs=1).start()
    consumer = bc.Consumer("broken", batch_size=2)
    with pytest.raises(bc.LoaderError, match="KeyError: 'missing shard 3'"):
        list(consumer)
    consumer.close()
    with pytest.raises(KeyError, match="missing shard 3"):
        producer.stop()


def test_a_serving_producer_keeps_nothing_of_consumers_that_left(runtime_dir):
    # Each consumer gets a mailbox (a memfd and a pipe in the producer): a
    # producer that serves for days must let go of them as consumers leave.
    class Slow:
        def __iter__(self):
            for start in range(0, 40, 10):
                time.sleep(0.005)
                ids = torch.arange(start, start + 10)
                yield ids, ids.double()

    def one_consumer() -> None:
        c = bc.Consumer("keepnothing", batch_size=10, timeout=10)
        ids, _ = next(iter(c))
        assert len(ids) == 10
        c.close()

    with bc.Producer(Slow(), "keepnothing") as producer:  # serves until closed
        one_consumer()  # the ring exists from here on
        gc.collect()
        eventually(lambda: producer.stats()["consumers"] == [], "the first consumer forgotten")
        fds = open_fds()
        for _ in range(6):
            one_consumer()
        gc.collect()
        eventually(lambda: producer.stats()["consumers"] == [] and open_fds() == fds,
                   f"fds back to {fds} with every consumer gone (now {open_fds()})")
        assert producer.stats()["joins"] == 7


def test_fds_threads_and_shm_return_to_baseline(runtime_dir):
    gc.collect()  # objects of earlier tests (kept by tracebacks) hold fds too
    fds, threads, shm = open_fds(), threading.active_count(), shm_entries()
    mappings = batchcast_mappings()
    for round_ in range(3):
        counts = []

        def train(batch_size: int) -> None:
            with bc.Consumer(f"leak{round_}", batch_size=batch_size) as c:
                counts.extend(sum(len(ids) for ids, _ in c) for _ in range(2))

        with bc.Producer(id_batches(100, 10), f"leak{round_}", epochs=2, min_consumers=3):
            workers = [threading.Thread(target=train, args=(b,)) for b in (7, 10, 33)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(60)
        assert counts == [100] * 6
    gc.collect()
    assert open_fds() == fds
    assert threading.active_count() == threads
    assert shm_entries() == shm
    assert batchcast_mappings() == mappings  # rings and mailboxes unmapped
    assert list(runtime_dir.iterdir()) == []


def test_consumer_batches_far_larger_than_the_ring_still_progress(runtime_dir):
    # L=4 with a 2-slot ring and B=50: pending samples are spilled out of the
    # ring, so the producer never waits for a batch that cannot complete.
    with bc.Producer(id_batches(203, 4), "huge-b", epochs=2, slots=2):
        consumer = bc.Consumer("huge-b", batch_size=50)
        for _ in range(2):
            batches = [ids.tolist() for ids, _ in consumer]
            assert [len(b) for b in batches] == [50, 50, 50, 50, 3]
            assert sum(batches, []) == list(range(203))
        assert consumer.stats()["spills"] > 0
        consumer.close()


def test_a_straggler_is_evicted_with_a_clear_error_and_the_others_go_on(runtime_dir):
    producer = bc.Producer(id_batches(400, 4), "strag", epochs=1, slots=2, min_consumers=2,
                           straggler_timeout=0.5).start()
    fast = bc.Consumer("strag", batch_size=4)
    slow = bc.Consumer("strag", batch_size=4)
    slow_iter = iter(slow)
    held = next(slow_iter)  # ...and then it stops consuming
    seen = [ids.tolist() for ids, _ in fast]
    assert sum(seen, []) == list(range(400))
    with pytest.raises(bc.Evicted, match="straggler_timeout=0.5"):
        next(slow_iter)
    assert held[0].tolist() == [0, 1, 2, 3]  # what it held stays valid
    stats = producer.stats()
    assert stats["evictions"] == 1 and stats["crashes"] == 0
    fast.close()
    slow.close()
    producer.stop()


def test_straggler_timeout_must_be_positive(runtime_dir):
    with pytest.raises(ValueError, match="straggler_timeout"):
        bc.Producer(id_batches(4, 2), "x", straggler_timeout=0)


def test_late_joiners_catch_up_within_the_window_or_start_at_the_next_epoch(runtime_dir, caplog):
    caplog.set_level("INFO", logger="batchcast")
    gate = threading.Semaphore(0)

    class GatedLoader:  # yields batch i only when the test lets it
        def __iter__(self):
            for i in range(10):
                gate.acquire()
                yield torch.arange(4 * i, 4 * i + 4)

    def published(count: int) -> None:  # ...and announced to the first consumer
        eventually(lambda: any(c["batches_sent"] >= count for c in producer.stats()["consumers"]),
                   f"{count} batches announced")

    results: dict[str, list] = {}

    def train(key: str, consumer: bc.Consumer, epochs: int) -> None:
        results[key] = [sum((x.tolist() for x in consumer), []) for _ in range(epochs)]
        consumer.close()

    producer = bc.Producer(GatedLoader(), "late", epochs=2, slots=8, catch_up_window=4).start()
    threads = [threading.Thread(target=train, args=("first", bc.Consumer("late", batch_size=4), 2))]
    threads[0].start()
    gate.release(2)
    published(2)
    threads.append(threading.Thread(target=train, args=(
        "catch_up", bc.Consumer("late", batch_size=3, join="catch_up"), 2)))
    threads.append(threading.Thread(target=train, args=(
        "next_epoch", bc.Consumer("late", batch_size=4), 1)))
    threads[-2].start()
    threads[-1].start()
    gate.release(4)
    published(6)  # past the window of 4
    threads.append(threading.Thread(target=train, args=(
        "too_late", bc.Consumer("late", batch_size=4, join="catch_up"), 1)))
    threads[-1].start()
    gate.release(100)
    for t in threads:
        t.join(30)
    producer.stop()
    every = list(range(40))
    assert results["first"] == [every, every]
    assert results["catch_up"] == [every, every]  # all of epoch 0, though it joined late
    assert results["next_epoch"] == [every]       # epoch 1 only
    assert results["too_late"] == [every]         # past the window: epoch 1 only...
    # ...and says so, through logging (a sweep collects it with the trial's logs).
    fallback = [r for r in caplog.records if "after its first 4 batches" in r.getMessage()]
    assert len(fallback) == 1 and fallback[0].name == "batchcast", caplog.text
    assert "joined epoch 0 of producer 'late'" in fallback[0].getMessage()


def test_the_consumer_takes_a_dataloaders_arguments_and_option_objects_for_the_rest(runtime_dir):
    assert list(inspect.signature(bc.Consumer).parameters) == [
        "name", "batch_size", "drop_last", "timeout", "device", "state", "transform", "pad", "group", "join",
        "stall_timeout"]
    # Each option object checks itself where it is written, is plain data
    # (frozen: one can serve several consumers) and has a plain form.
    for option in (bc.Augment(lambda s: s), bc.Pad(0), bc.Group("g", 0, 2), bc.Join(), bc.Placement()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            option.seed = 1  # type: ignore[misc, union-attr]
    assert bc.Join.of("catch_up") == bc.Join("catch_up")
    assert bc.Placement.of("cpu") == bc.Placement("cpu")
    assert bc.Pad.of({"x": 0}) == bc.Pad({"x": 0}) and bc.Pad({"x": 0, ("y", 1): -1}).leaves == (
        (("x",), 0.0), (("y", "1"), -1.0))
    with pytest.raises(ValueError, match="writable=True makes every batch a private copy; "
                                         "shared_gpu_views=True hands out views every consumer shares"):
        bc.Placement(writable=True, shared_gpu_views=True)
    with pytest.raises(ValueError, match="release_after must be 'stream' or 'device', not 'never'"):
        bc.Placement(release_after="never")
    # the spellings of before the options were grouped are gone, not ignored
    for old in ({"late_join": "now"}, {"writable": True}, {"pad_to_multiple_of": 8}, {"rank": 0},
                {"with_indices": True}):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(old))}'"):
            bc.Consumer("x", batch_size=2, **old)  # type: ignore[arg-type]
    with bc.Producer(id_batches(12, 4), "options", epochs=1):
        with bc.Consumer("options", batch_size=6, timeout=10, device=bc.Placement("cpu", writable=True),
                         join=bc.Join("next_epoch", past_last_epoch="empty")) as c:
            got = [ids.tolist() for ids, _ in c]
            got_again = list(c)  # past the last epoch: empty, as asked
        stats = c.stats()
    assert got == [list(range(6)), list(range(6, 12))] and got_again == []
    assert stats["batch_copies"] == 2 and stats["device"] == "cpu"


def test_bad_join_is_a_clear_error(runtime_dir):
    with pytest.raises(ValueError, match="join must be one of .now., .next_epoch., .catch_up., not .rubber."):
        bc.Consumer("x", batch_size=2, join="rubber")
    with pytest.raises(ValueError, match="catch_up_window must be at most"):
        bc.Producer(id_batches(4, 2), "x", slots=4, catch_up_window=3)


def test_garbage_on_the_producer_socket_is_dropped_and_counted(runtime_dir):
    """A rogue local client sends random, truncated, oversized and other-version
    messages; the producer drops and counts them, refuses the other version
    clearly, and its real consumer never notices."""
    import random
    import struct

    zmq = pytest.importorskip("zmq", reason="pyzmq plays the rogue client (pip install pyzmq)")
    rng = random.Random(7)
    with bc.Producer(id_batches(100, 10), "rogue", epochs=1) as producer:
        ctx = zmq.Context()
        rogue = ctx.socket(zmq.DEALER)
        rogue.connect(f"ipc://{runtime_dir}/rogue.sock")
        head = lambda version, kind: struct.pack("<IHH", 0x54534342, version, kind)  # noqa: E731
        garbage = [bytes(rng.randrange(256) for _ in range(rng.randrange(64))) for _ in range(50)]
        v = bc.PROTOCOL_VERSION
        garbage += [head(v, 1)[:5], head(v, 1) + b"\x01", head(v, 9) + struct.pack("<I", 1 << 30),
                    head(v, 4) + b"\xff" * 100, b"", head(v, 99)]
        for g in garbage:
            rogue.send(g)
        rogue.send_multipart([b"two", b"frames"])
        other = v + 1
        rogue.send(head(other, 1) + struct.pack("<qI", 1234, 0))  # a Hello of another version
        assert rogue.poll(5000), "no refusal"
        refusal = rogue.recv()
        assert struct.unpack("<IHH", refusal[:8])[2] == 3  # Refuse
        assert f"speaks batchcast protocol {v} but this consumer speaks {other}".encode() in refusal
        consumer = bc.Consumer("rogue", batch_size=10)
        assert sum((ids.tolist() for ids, _ in consumer), []) == list(range(100))
        stats = producer.stats()
        assert stats["refused"] == 1
        assert stats["dropped_messages"] >= 50
        assert stats["joins"] == 1
        consumer.close()
        rogue.close(0)
        ctx.term()


def test_a_consumer_without_a_batch_size_gets_the_loaders_batches_as_they_are(runtime_dir):
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(103), torch.arange(103).double() * 10)
    loader = DataLoader(data, batch_size=10)
    with bc.Producer(loader, "forward", epochs=2):
        consumer = bc.Consumer("forward", timeout=10)
        assert len(consumer) == len(loader) == 11  # the loader's length, known at once
        for _ in range(2):
            sizes = []
            for (ids, values), (want_ids, want_values) in zip(consumer, loader):
                assert torch.equal(ids, want_ids) and torch.equal(values, want_values)
                sizes.append(len(ids))
            assert sizes == [10] * 10 + [3]
        stats = consumer.stats()
        assert stats["copies"] == 0 and stats["views"] == 2 * 2 * 11  # two tensors per batch
        consumer.close()


def kept_batches(name: str, keep: int) -> tuple[list, dict]:
    """Takes one epoch of 40 wide batches through a 4-slot ring, keeping every batch."""
    with bc.Producer(id_batches(160, 4, width=1024), name, epochs=1, slots=4):
        with bc.Consumer(name, batch_size=4, timeout=10) as consumer:
            kept = [batch for batch in consumer][:keep]
            return kept, consumer.stats()


def test_keeping_batches_gives_one_python_warning_naming_the_fix(runtime_dir):
    with pytest.warns(bc.KeptBatchesWarning, match=r"\.clone\(\)") as caught:
        kept, stats = kept_batches("warn", keep=40)
    assert len([w for w in caught if issubclass(w.category, bc.KeptBatchesWarning)]) == 1
    assert caught[0].filename == __file__  # points at the user's loop, not batchcast
    assert stats["private_copies"] > 30
    for i, (ids, rows) in enumerate(kept):  # all valid, views and copies alike
        assert ids.tolist() == list(range(4 * i, 4 * i + 4))
        assert torch.equal(rows, (ids * 10).double().view(-1, 1).repeat(1, 1024))


def test_warnings_can_be_turned_into_errors(runtime_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error", bc.BatchcastWarning)
        with pytest.raises(bc.KeptBatchesWarning):
            kept_batches("strict", keep=40)


def test_joins_and_leaves_are_logged(runtime_dir, caplog):
    caplog.set_level("INFO", logger="batchcast")
    with bc.Producer(id_batches(8, 4), "logged", epochs=1) as producer:
        with bc.Consumer("logged", batch_size=4, timeout=10) as consumer:
            assert sum(len(ids) for ids, _ in consumer) == 8
        producer._thread.join(10)
    messages = [r.getMessage() for r in caplog.records if r.name == "batchcast"]
    assert any("of producer 'logged' joined (first epoch 0)" in m for m in messages), messages
    assert any("of producer 'logged' left" in m for m in messages), messages


def test_status_reports_running_producers_through_the_protocol(runtime_dir):
    from batchcast.status import list_producers

    # Both consumers join before the first batch (min_consumers): both take part in epoch 0.
    with bc.Producer(id_batches(400, 4), "watched", epochs=None, slots=4,
                     min_consumers=2) as producer:
        with bc.Consumer("watched", batch_size=6, timeout=10) as a, \
                bc.Consumer("watched", timeout=10) as b:
            next(iter(a)), next(iter(b))
            eventually(lambda: producer.stats()["batches_published"] > 0, "a batch published")
            (listing,) = list_producers()
            assert listing["name"] == "watched" and listing["alive"], listing
            status = listing["status"]
            assert status["pid"] == os.getpid() and status["ring_device"] == "cpu"
            assert status["batches_published"] > 0 and status["slots"] == 4
            assert sorted(c["batch_size"] for c in status["consumers"]) == [0, 6]
            for c in status["consumers"]:
                assert c["pid"] == os.getpid() and c["lag"] >= 0 and c["slots_held"] >= 1
            assert list_producers("elsewhere")[0]["note"] == "no producer named 'elsewhere' is running"


def test_status_reports_and_removes_what_a_dead_producer_left(runtime_dir):
    import subprocess
    import sys

    from batchcast.status import list_producers

    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, torch, batchcast as bc\n"
        "p = bc.Producer([torch.zeros(2)], 'ghost', epochs=None).start()\n"
        "print('serving', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "serving"
    assert [p["alive"] for p in list_producers()] == [True]
    child.kill()  # no chance to clean up
    child.wait()
    assert sorted(f.name for f in runtime_dir.iterdir()) == ["ghost.lock", "ghost.sock"]
    (listing,) = list_producers()
    assert not listing["alive"] and listing["status"] is None
    assert "gone; removed" in listing["note"]
    assert list(runtime_dir.iterdir()) == []
    assert list_producers() == []
    with bc.Producer(id_batches(4, 2), "ghost", epochs=1):  # the name is free again
        pass


def test_importing_batchcast_does_not_import_ray_until_asked():
    """batchcast.ray is an optional extra: a plain import never pays for Ray."""
    import subprocess
    import sys

    code = ("import sys, batchcast\n"
            "assert 'ray' not in sys.modules and 'batchcast.ray' not in sys.modules\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _shmem_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            return next(w.strip("[]") for w in f.read().split() if w.startswith("["))
    except (OSError, StopIteration):
        return "unknown"


def _pmd_mapped_kib(address: int) -> tuple[int, int]:
    """(Rss, ShmemPmdMapped) in KiB of this process's mapping at `address`."""
    inside, rss, pmd = False, 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                rss = int(line.split()[1])
            elif inside and head == "ShmemPmdMapped:":
                pmd = int(line.split()[1])
    return rss, pmd


def test_the_ring_is_mapped_in_huge_pages_where_the_system_allows_them(runtime_dir):
    # 2 MiB pages: a consumer maps, faults and unmaps the ring in 512x fewer
    # page-table entries (closing one whose ring holds 64 MiB batches: 67 ms
    # of CPU with 4 KiB pages, under 1 ms with these).
    mode = _shmem_huge_pages()
    if mode not in ("advise", "within_size", "always", "force"):
        why = f"the system gives shared memory no huge pages (shmem_enabled: {mode})"
        if os.environ.get("BATCHCAST_REQUIRE_HUGE_PAGES"):  # scripts/test.sh switched them on
            pytest.fail(why)
        pytest.skip(why)
    rows = 4 << 20  # 16 MiB float32 batches
    loader = [torch.full((1, rows), float(i)) for i in range(6)]
    with bc.Producer(loader, "huge", epochs=1).start(), bc.Consumer("huge", timeout=30) as c:
        for i, batch in enumerate(c):
            assert float(batch[0, ::1024].sum()) == i * (rows // 1024)  # every page read
            if i == 3:
                address = c.stats()["ring_address"]
                assert address % (2 << 20) == 0
                rss, pmd = _pmd_mapped_kib(address)
                assert rss >= 4 * 16 * 1024 and pmd == rss, (rss, pmd)
            del batch


def test_a_closed_producer_or_consumer_says_so_when_used_again(runtime_dir):
    producer = bc.Producer(id_batches(6, 3), "again", epochs=1)
    producer.close()
    with pytest.raises(RuntimeError, match=r"producer 'again' is closed .* make a new Producer"):
        producer.start()
    with pytest.raises(RuntimeError, match=r"producer 'again' is closed"):
        producer.run()
    assert producer.stats()["name"] == "again" and producer.consumers == 0
    with bc.Producer(id_batches(6, 3), "again", epochs=1) as served:  # the name is free
        consumer = bc.Consumer("again", batch_size=4)
        assert [ids.tolist() for ids, _ in consumer] == [[0, 1, 2, 3], [4, 5]]
        consumer.close()
        with pytest.raises(RuntimeError, match=r"consumer of 'again' is closed"):
            next(iter(consumer))
    with pytest.raises(RuntimeError, match=r"producer 'again' is closed"):
        served.start()  # stopped by the with block
