// A consumer's mapping of the producer's ring, opened once at join: host
// shared memory (the producer's memfd, read-only) or a GPU allocation opened
// with CUDA IPC. The one place that knows how a slot becomes readable (GPU:
// the reading stream waits on the slot's event) and when it may go back to
// the producer (GPU: once every stream that used it is past its last use).
#pragma once


#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "batchcast/tensor/tensor.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/protocol/message.h"

namespace batchcast {

class MappedRing {
 public:
  // Called once a released slot can be reused: at once for host memory, from
  // a waiting thread once the GPU is past it for device memory.
  using Released = std::function<void(uint64_t seq)>;

  // When a GPU slot may go back: once the streams that used it are past it
  // (the default), or once the whole device is (for batches also used on
  // streams other than the one current when they were taken or released).
  enum class ReleaseAfter { Stream, Device };

  // Maps `ring` of the producer process `producer_pid`. Throws SystemError,
  // CudaError (GPU not visible here, CUDA IPC failed) or MalformedMessage.
  static std::unique_ptr<MappedRing> open(const protocol::Ring& ring, int64_t producer_pid,
                                          Released released,
                                          ReleaseAfter after = ReleaseAfter::Stream);
  virtual ~MappedRing() = default;

  const std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  // Where the memory is, as numbered in this process.
  virtual Device device() const = 0;
  // Slot events an announcement may name (0: host memory has none).
  virtual int events() const { return 0; }

  // Before reading a slot: for GPU memory the current stream of the ring's
  // device waits on the slot's event (no device sync); returns that stream.
  virtual std::optional<cuda::StreamRef> ready(int32_t event) = 0;
  // The slot is no longer referenced in this process; it was used on
  // `stream` (GPU). Calls `released(seq)` once it may be reused. Never throws.
  virtual void release(uint64_t seq, const std::optional<cuda::StreamRef>& stream) noexcept = 0;
  // Releases still waiting for the GPU.
  virtual int64_t releases_in_flight() const { return 0; }

  int64_t ipc_memory_opens() const { return memory_opens_; }
  int64_t ipc_event_opens() const { return event_opens_; }

 protected:
  const std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  int64_t memory_opens_ = 0;
  int64_t event_opens_ = 0;
};

}  // namespace batchcast
