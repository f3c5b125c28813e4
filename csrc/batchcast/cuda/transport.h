// The CUDA transport: a ring of GPU memory allocated once by batchcast and
// shared with consumers through CUDA IPC, with one interprocess event per
// slot. Written against cuda::Runtime (runtime.h: the CUDA runtime API, or the
// simulated device of the tests), with no torch and no CUDA header, so it
// builds whatever torch is installed. Without the toolkit at build time every
// call throws CudaError saying so (unless the simulated device is chosen).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/protocol/message.h"

namespace batchcast::cuda {

// Sizes of a GPU UUID and of cudaIpcMemHandle_t / cudaIpcEventHandle_t, as on the wire.
using protocol::kHandleBytes;
using protocol::kUuidBytes;

// True when this build contains the CUDA transport (or runs on the simulated device).
bool built();
// True on the simulated device (BATCHCAST_SIMULATED_CUDA; tests only). The
// test hooks ask this; batchcast itself asks what the runtime can do:
bool simulating();
// Whether tensors over device memory are CPU tensors (the simulated device's
// memory is host memory) rather than CUDA tensors (Runtime::device_memory_on_host).
bool device_memory_on_host();
// Devices this process can see; 0 without a driver or device (never throws).
int device_count();
// A device's UUID (16 raw bytes): stable across processes, unlike indices,
// which CUDA_VISIBLE_DEVICES renumbers.
std::string device_uuid(int device);
// The visible device with this UUID; CudaError naming the UUID and
// CUDA_VISIBLE_DEVICES when this process cannot see it.
int visible_device(const std::string& uuid);
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string uuid_text(const std::string& uuid);
// Whether `device` can read `peer`'s memory directly (P2P over NVLink/PCIe).
bool can_access_peer(int device, int peer);

// Makes `device` current for a scope, then puts back the calling thread's
// CUDA context exactly as it was — none included. So batchcast never creates
// a context on a GPU the caller did not use (CUDA 12 creates one on
// cudaSetDevice), nor leaves the caller's thread on the ring's device.
// Throws CudaError if `device` cannot be made current (unless !checked).
class DeviceScope {
 public:
  explicit DeviceScope(int device, bool checked = true);
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope();

 private:
  void* previous_ = nullptr;  // CUcontext
  bool saved_ = false;
};

// Producer side: the ring's memory on one device, its slot events, a
// dedicated copy stream and two pinned staging buffers, so that the
// host-to-device copy of one batch overlaps with loading the next.
class DeviceRing {
 public:
  DeviceRing(int device, uint64_t bytes, int events);
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;
  ~DeviceRing();

  std::byte* data() const { return data_; }
  uint64_t size() const { return bytes_; }
  int device() const { return device_; }
  int events() const { return static_cast<int>(events_.size()); }
  std::string uuid() const;
  std::string memory_handle() const;
  std::vector<std::string> event_handles() const;

  // A pinned host buffer of at least `bytes` whose previous copy has finished.
  // Two buffers alternate; staging_index() says which one the next call gives.
  std::byte* staging(uint64_t bytes);
  int staging_index() const { return current_; }
  // Queues a copy of host bytes (staged, or pinned memory of the caller's that
  // stays untouched until the copy is done) into the ring on the copy stream.
  void copy_in(const std::byte* staged, uint64_t ring_offset, uint64_t bytes);
  // After a batch's copies: records slot event `event` on the copy stream
  // (consumers' streams wait on it).
  void record_slot(int event);
  // After a batch's copies: hands its staging buffer back, to be reused once
  // those copies are done.
  void finish_staging();
  // Waits for every queued copy.
  void synchronize();

 private:
  struct Staging {
    std::byte* data = nullptr;
    uint64_t bytes = 0;
    void* done = nullptr;  // cudaEvent_t: its last copy has finished
  };
  void free_all();
  int device_;
  uint64_t bytes_;
  std::byte* data_ = nullptr;
  void* stream_ = nullptr;  // cudaStream_t
  std::vector<void*> events_;  // cudaEvent_t, interprocess
  Staging staging_[2];
  int current_ = 0;
};

// Consumer side: the producer's ring opened once, on the producer's GPU
// found by UUID, and its slot events opened once.
class ImportedRing {
 public:
  ImportedRing(const std::string& uuid, const std::string& memory_handle, uint64_t bytes,
               const std::vector<std::string>& event_handles);
  ImportedRing(const ImportedRing&) = delete;
  ImportedRing& operator=(const ImportedRing&) = delete;
  ~ImportedRing();  // closes the memory handle and the events

  const std::byte* data() const { return data_; }
  uint64_t size() const { return bytes_; }
  int device() const { return device_; }
  int events() const { return static_cast<int>(events_.size()); }
  void* event(int index) const { return events_.at(static_cast<std::size_t>(index)); }

 private:
  void close_all();
  int device_ = -1;
  uint64_t bytes_;
  std::byte* data_ = nullptr;
  std::vector<void*> events_;
};

// Consumer side: a slot goes back to the producer only once the GPU work that
// used it is done. The caller records a pooled event on its stream where it
// let go of the slot; a thread waits for it (blocking, not spinning) and then
// calls `done(seq)`.
class ReleaseWaiter {
 public:
  ReleaseWaiter(int device, std::function<void(uint64_t)> done);
  ReleaseWaiter(const ReleaseWaiter&) = delete;
  ReleaseWaiter& operator=(const ReleaseWaiter&) = delete;
  ~ReleaseWaiter();  // waits for what is pending, then stops

  // An event from the pool (cudaEvent_t) for the caller to record.
  void* acquire();
  // Hands a recorded event over: `done(seq)` follows its completion. With no
  // event, `done(seq)` follows a synchronization of the whole device.
  void add(uint64_t seq, void* event);
  // Returns an event that was not recorded after all.
  void discard(void* event);
  int64_t pending() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace batchcast::cuda
