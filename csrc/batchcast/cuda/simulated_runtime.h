// A simulated CUDA device, for tests on machines without a GPU: the GPU ring's
// rules run unchanged against it (cuda/runtime.h), with timing made hostile.
//
//   BATCHCAST_SIMULATED_CUDA="seed=3,max_delay_us=2000,devices=1"
//
// selects it for a whole process (set it in the environment of every process
// of a test: producer and consumers). What it models:
//   - device memory is host memory (a memfd), exported and opened over "IPC"
//     through /proc/<pid>/fd; a consumer maps it readable and writable, as
//     cudaIpcOpenMemHandle does (nothing stops an in-place write);
//   - a stream is an ordered queue run by its own thread; each copy and host
//     function starts after a random delay in [0, max_delay_us], so the host
//     runs ahead of the device as it does on a GPU;
//   - an event completes when its stream reaches the point where it was
//     recorded; a wait makes a stream (or, for the default stream, the calling
//     thread) block until the event's latest record as of the call completes.
//     Interprocess events live in shared memory, so a consumer's stream waits
//     for the producer's copies;
//   - the default stream (nullptr) runs in the calling thread at once: a
//     consumer that reads its batches on the host reads in stream order;
//   - CUDA_VISIBLE_DEVICES, as the driver reads it: a process sees the
//     devices it lists, numbered in its order, each with its machine-wide
//     UUID (devices=N is the machine's count);
//   - each thread has a current context (none at first); a call that needs one
//     binds the current device's, and leaves it current, as the real runtime
//     does — so tests can see that batchcast leaves a caller's thread as it
//     found it;
//   - pinned host memory is what host_alloc() and take_pinned() gave out,
//     and what host_register() pinned until host_unregister();
//   - memory a consumer allocates for its tensors (stream_alloc) is freed in
//     stream order, as torch's caching allocator reuses a freed block only
//     for work queued after what used it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "batchcast/cuda/runtime.h"

namespace batchcast::cuda::simulated {

struct Options {
  uint64_t seed = 1;
  int64_t max_delay_us = 1000;
  int devices = 1;
};
// Parses "key=value,..." (keys seed, max_delay_us, devices); InvalidArgument
// names what is wrong.
Options parse_options(const std::string& spec);
// The machine's devices (of `devices`) this process sees, in its order, as
// the driver reads CUDA_VISIBLE_DEVICES: numbered from 0 here; the list ends
// at its first entry that is not a device (or one named twice).
std::vector<int> visible_devices(int devices);

// Whether this process runs on the simulated device.
bool active();

// The calling thread's current stream, as torch's current stream is for a
// real GPU (nullptr, the default stream, until set).
Stream current_stream();
void set_current_stream(Stream stream);

// Pinned host memory from a cache that hands a block out again as soon as it
// is given back, last in first out — as a pinned-memory allocator reuses a
// freed block — so that a copy still reading a block after its owner let go
// of it reads the next batch's bytes. For loaders in tests.
void* take_pinned(uint64_t bytes);
void give_back_pinned(void* memory) noexcept;

// Memory for a tensor made on `stream`: given back by stream_free only once
// that stream has run what was queued on it before (a stream that no longer
// exists: at once). As torch's caching allocator on a GPU: a tensor dropped
// while work reading it is still queued keeps its bytes until that work ran.
void* stream_alloc(uint64_t bytes);
void stream_free(void* memory, Stream stream) noexcept;

// The simulated context current on the calling thread, as a number (0: none),
// and the one a device's primary context is.
uint64_t current_context_id();
uint64_t primary_context_id(int device);

}  // namespace batchcast::cuda::simulated
