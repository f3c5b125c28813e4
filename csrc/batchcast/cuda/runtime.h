// The CUDA runtime calls the transport makes, behind one small interface, so
// that the transport's rules (staging and its reuse, copy then event record,
// the consumer's wait before use, the stream-ordered release) run unchanged
// against either the real runtime (cuda/cuda_runtime.cpp, libcudart) or a
// simulated device (cuda/simulated_runtime.cpp: host memory, streams as queues
// run by threads, copies after random delays) that tests select with
// BATCHCAST_SIMULATED_CUDA. No CUDA or torch header here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace batchcast::cuda {

using Stream = void*;  // cudaStream_t; nullptr is the default stream
using Event = void*;   // cudaEvent_t

// A stream of a device, by its runtime handle: where a consumer used a slot.
struct StreamRef {
  int device = -1;
  Stream stream = nullptr;
  bool operator==(const StreamRef& o) const { return device == o.device && stream == o.stream; }
};

class Runtime {
 public:
  virtual ~Runtime() = default;

  // False for a build without the CUDA transport: every call but
  // device_count() then throws CudaError saying so.
  virtual bool built() const = 0;
  // True for the simulated device (for its test hooks: what the transport and
  // the consumer do depends on device_memory_on_host() and the calls below).
  virtual bool simulated() const { return false; }

  // Where tensors over device memory live. False on a GPU: they are torch's
  // CUDA tensors, used on torch's current stream, copied by torch. True where
  // device memory is host memory (the simulated device): they are CPU tensors,
  // which torch gives no stream, so the runtime keeps each thread's current
  // stream and the memory of copies made on it, freed in stream order.
  virtual bool device_memory_on_host() const { return false; }
  // Only where device_memory_on_host() (elsewhere CudaError: they are
  // torch's): the calling thread's current stream, and memory for a tensor
  // made on `stream`, given back by stream_free once that stream has run what
  // was queued on it before, as torch's caching allocator does on a GPU.
  virtual Stream current_stream();
  virtual void* stream_alloc(uint64_t bytes);
  virtual void stream_free(void* memory, Stream stream) noexcept;

  // Devices visible to this process; 0 without a driver (never throws).
  virtual int device_count() noexcept = 0;
  virtual std::string device_uuid(int device) = 0;  // 16 raw bytes
  virtual bool can_access_peer(int device, int peer) = 0;

  // The calling thread's current context (nullptr: none) and the primary
  // context of a device (retained for the life of the process; nullptr when
  // refused). context_switching() is false where these are unavailable; the
  // transport then falls back to set_device().
  virtual bool context_switching() noexcept = 0;
  virtual bool current_context(void** context) noexcept = 0;
  virtual bool set_current_context(void* context) noexcept = 0;
  virtual void* primary_context(int device) noexcept = 0;
  virtual bool current_device(int* device) noexcept = 0;
  virtual void set_device(int device) = 0;

  // Device memory (one allocation, exported over IPC) and pinned host memory.
  virtual void* device_alloc(uint64_t bytes) = 0;
  virtual void device_free(void* memory) noexcept = 0;
  virtual void* host_alloc(uint64_t bytes) = 0;
  virtual void host_free(void* memory) noexcept = 0;
  // Page-locked host memory the device can copy from directly: what
  // host_alloc() gave, and memory of the caller's that host_register() pinned
  // (cudaHostRegister: a shared mapping other processes write into stays
  // shared) until host_unregister(), which comes before it is unmapped.
  virtual bool is_pinned(const void* memory) noexcept = 0;
  virtual void host_register(void* memory, uint64_t bytes) = 0;
  virtual void host_unregister(void* memory) noexcept = 0;

  // A stream that does not synchronize with the default stream.
  virtual Stream stream_create() = 0;
  virtual void stream_destroy(Stream stream) noexcept = 0;
  virtual void stream_synchronize(Stream stream) = 0;
  // Work queued on `stream` after this waits for the event's latest record.
  virtual void stream_wait(Stream stream, Event event) = 0;
  // Runs `fn` (which must make no CUDA call) once `stream` reaches it; the
  // stream waits for it to return.
  virtual void launch_host_function(Stream stream, std::function<void()> fn) = 0;

  enum EventFlag : unsigned { kInterprocess = 1, kBlockingSync = 2 };
  // Timing is always disabled (interprocess events require it).
  virtual Event event_create(unsigned flags) = 0;
  virtual void event_destroy(Event event) noexcept = 0;
  virtual void event_record(Event event, Stream stream) = 0;
  virtual void event_synchronize(Event event) = 0;

  enum class Copy { HostToDevice, DeviceToDevice, DeviceToHost };
  virtual void copy_async(void* dst, const void* src, uint64_t bytes, Copy kind, Stream stream) = 0;
  // Waits for all work of this process on the current device.
  virtual void device_synchronize() = 0;

  // CUDA IPC: handles of kHandleBytes (protocol/message.h) raw bytes.
  virtual std::string memory_handle(void* device_memory) = 0;
  virtual void* open_memory_handle(const std::string& handle) = 0;
  virtual void close_memory_handle(void* memory) noexcept = 0;
  virtual std::string event_handle(Event event) = 0;
  virtual Event open_event_handle(const std::string& handle) = 0;
};

// The runtime of this process, chosen at its first use: the simulated device
// when BATCHCAST_SIMULATED_CUDA is set (tests only; see simulated_runtime.h),
// else libcudart, else (a build without the toolkit) one that says so.
Runtime& runtime();

// Only where the real runtime was compiled in (cuda_runtime.cpp, or
// unavailable.cpp without the toolkit).
Runtime& cuda_runtime();
// cuda/simulated_runtime.cpp; `spec` is BATCHCAST_SIMULATED_CUDA's value.
Runtime& simulated_runtime(const std::string& spec);

// Test hook (BATCHCAST_TEST_RING_DELAY_US, microseconds): a producer's ring
// stream sleeps this long before each batch's copies, so that a consumer that
// reads a slot without waiting for its event reads stale data. 0: off.
int64_t test_ring_delay_us();

}  // namespace batchcast::cuda
