#include "batchcast/cuda/transport.h"

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "batchcast/common/threads.h"

namespace batchcast::cuda {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state for the next call
    throw CudaError(std::string("batchcast: ") + call + " failed: " + cudaGetErrorName(status) +
                    " (" + cudaGetErrorString(status) + ")");
  }
}

// The driver's current context of the calling thread, saved and restored as
// it was (including "none"), through entry points the runtime hands out: this
// file links the runtime only.
using CUcontext = void*;
struct ContextCalls {
  int (*get)(CUcontext*) = nullptr;                 // cuCtxGetCurrent
  int (*set)(CUcontext) = nullptr;                  // cuCtxSetCurrent
  int (*device)(int*, int) = nullptr;               // cuDeviceGet
  int (*retain_primary)(CUcontext*, int) = nullptr;  // cuDevicePrimaryCtxRetain
  bool usable() const { return get && set && device && retain_primary; }
};

const ContextCalls& context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    auto find = [](const char* name) -> void* {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      return fn;
    };
    c.get = reinterpret_cast<int (*)(CUcontext*)>(find("cuCtxGetCurrent"));
    c.set = reinterpret_cast<int (*)(CUcontext)>(find("cuCtxSetCurrent"));
    c.device = reinterpret_cast<int (*)(int*, int)>(find("cuDeviceGet"));
    c.retain_primary = reinterpret_cast<int (*)(CUcontext*, int)>(find("cuDevicePrimaryCtxRetain"));
    return c;
  }();
  return calls;
}

// The primary context of `device` (the one the runtime and torch use),
// retained once for the life of the process; nullptr if the driver refuses.
CUcontext primary_context(int device) {
  static std::mutex mu;
  static std::vector<CUcontext> contexts;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) return nullptr;
  if (static_cast<std::size_t>(device) >= contexts.size()) contexts.resize(device + 1, nullptr);
  if (contexts[device] == nullptr) {
    const ContextCalls& calls = context_calls();
    int handle = 0;
    CUcontext ctx = nullptr;
    if (calls.device(&handle, device) == 0 && calls.retain_primary(&ctx, handle) == 0) {
      contexts[device] = ctx;
    }
  }
  return contexts[device];
}

}  // namespace

// Switches by making the device's primary context current, never with
// cudaSetDevice: that would also change the runtime's remembered device for
// the thread (torch.cuda.current_device()), which a thread without a current
// context keeps. Without the driver entry points it falls back to
// cudaSetDevice and restores only the context.
DeviceScope::DeviceScope(int device, bool checked) {
  const ContextCalls& calls = context_calls();
  if (calls.usable() && calls.get(&previous_) == 0) {
    CUcontext target = primary_context(device);
    if (target != nullptr) {
      if (target != previous_) {
        if (calls.set(target) == 0) {
          saved_ = true;
        } else if (checked) {
          throw CudaError("batchcast: cannot make cuda:" + std::to_string(device) + "'s context current");
        }
      }
      return;
    }
  }
  saved_ = calls.get != nullptr && calls.set != nullptr && calls.get(&previous_) == 0;
  int current = -1;
  if (previous_ != nullptr && cudaGetDevice(&current) == cudaSuccess && current == device) {
    saved_ = false;  // already there: nothing to change or restore
    return;
  }
  cudaGetLastError();
  cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) {
    saved_ = false;
    if (checked) check(status, "cudaSetDevice");
    cudaGetLastError();
  }
}

// Restores the thread's context exactly, "none" included: a thread that never
// used a GPU is left without one, instead of being moved to device 0 (whose
// context would be created) or left on the ring's device.
DeviceScope::~DeviceScope() {
  if (saved_) context_calls().set(previous_);
}

namespace {

cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

bool built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_uuid(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(reinterpret_cast<const char*>(prop.uuid.bytes), kUuidBytes);
}

int visible_device(const std::string& uuid) {
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    if (device_uuid(d) == uuid) return d;
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  throw CudaError("the producer's ring is on GPU " + uuid_text(uuid) + ", which this process cannot see (" +
                  std::to_string(n) + " visible GPUs, CUDA_VISIBLE_DEVICES=" + (visible ? visible : "<unset>") +
                  "); make that GPU visible to the consumer (it may train on another one)");
}

std::string uuid_text(const std::string& uuid) {
  std::string out = "GPU-";
  char hex[3];
  for (std::size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(uuid[i]));
    out += hex;
  }
  return out;
}

bool can_access_peer(int device, int peer) {
  int can = 0;
  check(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer");
  return can != 0;
}

// ---- DeviceRing -----------------------------------------------------------

DeviceRing::DeviceRing(int device, uint64_t bytes, int events) : device_(device), bytes_(bytes) {
  if (device < 0 || device >= device_count()) {
    throw CudaError("batchcast: cuda:" + std::to_string(device) + " is not a device this process can see (" +
                    std::to_string(device_count()) + " visible)");
  }
  DeviceScope scope(device_);
  try {
    // Plain cudaMalloc: one allocation exported once, whatever allocator
    // settings torch runs with (expandable segments cannot be exported this way).
    void* p = nullptr;
    check(cudaMalloc(&p, bytes_), "cudaMalloc of the ring");
    data_ = static_cast<std::byte*>(p);
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    stream_ = stream;
    for (int i = 0; i < events; ++i) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess),
            "cudaEventCreate (interprocess)");
      events_.push_back(e);
      // Recorded once, so that waiting on a never-used slot event is a no-op.
      check(cudaEventRecord(e, stream), "cudaEventRecord");
    }
    for (Staging& s : staging_) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreate");
      s.done = e;
    }
  } catch (...) {
    free_all();
    throw;
  }
}

DeviceRing::~DeviceRing() { free_all(); }

void DeviceRing::free_all() {
  DeviceScope scope(device_, false);
  if (stream_ != nullptr) cudaStreamSynchronize(as_stream(stream_));
  for (Staging& s : staging_) {
    if (s.data != nullptr) cudaFreeHost(s.data);
    if (s.done != nullptr) cudaEventDestroy(as_event(s.done));
    s = Staging{};
  }
  for (void* e : events_) cudaEventDestroy(as_event(e));
  events_.clear();
  if (stream_ != nullptr) cudaStreamDestroy(as_stream(stream_));
  stream_ = nullptr;
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  cudaGetLastError();
}

std::string DeviceRing::uuid() const { return device_uuid(device_); }

std::string DeviceRing::memory_handle() const {
  DeviceScope scope(device_);
  cudaIpcMemHandle_t h;
  check(cudaIpcGetMemHandle(&h, data_), "cudaIpcGetMemHandle");
  static_assert(sizeof(h) == kHandleBytes, "cudaIpcMemHandle_t size");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::vector<std::string> DeviceRing::event_handles() const {
  DeviceScope scope(device_);
  std::vector<std::string> out;
  for (void* e : events_) {
    cudaIpcEventHandle_t h;
    check(cudaIpcGetEventHandle(&h, as_event(e)), "cudaIpcGetEventHandle");
    static_assert(sizeof(h) == kHandleBytes, "cudaIpcEventHandle_t size");
    out.emplace_back(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  return out;
}

// Per batch, only stream-ordered calls on the ring's own stream and events.
// They work whichever device is current, but need a current context: with
// none the runtime binds one implicitly and leaves it current, so the caller
// (CudaRing::write) makes them inside a DeviceScope of the ring's device.
std::byte* DeviceRing::staging(uint64_t bytes) {
  Staging& s = staging_[current_];
  check(cudaEventSynchronize(as_event(s.done)), "cudaEventSynchronize (staging)");
  if (s.bytes < bytes) {
    DeviceScope scope(device_);
    if (s.data != nullptr) check(cudaFreeHost(s.data), "cudaFreeHost");
    s.data = nullptr;
    s.bytes = 0;
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc of the staging buffer");
    s.data = static_cast<std::byte*>(p);
    s.bytes = bytes;
    // Fault the pinned pages in now, not during the first batch's copy.
    std::memset(s.data, 0, bytes);
  }
  return s.data;
}

void DeviceRing::copy_in(const std::byte* staged, uint64_t ring_offset, uint64_t bytes) {
  if (bytes == 0) return;
  if (ring_offset > bytes_ || bytes > bytes_ - ring_offset) throw InvalidArgument("copy outside the ring");
  check(cudaMemcpyAsync(data_ + ring_offset, staged, bytes, cudaMemcpyHostToDevice, as_stream(stream_)),
        "cudaMemcpyAsync (host to device)");
}

void DeviceRing::commit(int event) {
  check(cudaEventRecord(as_event(events_.at(static_cast<std::size_t>(event))), as_stream(stream_)),
        "cudaEventRecord (slot)");
  check(cudaEventRecord(as_event(staging_[current_].done), as_stream(stream_)), "cudaEventRecord (staging)");
  current_ ^= 1;
}

void DeviceRing::synchronize() {
  check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
}

// ---- ImportedRing ---------------------------------------------------------

ImportedRing::ImportedRing(const std::string& uuid, const std::string& memory_handle, uint64_t bytes,
                           const std::vector<std::string>& event_handles)
    : bytes_(bytes) {
  if (memory_handle.size() != kHandleBytes) throw CudaError("batchcast: bad memory handle");
  device_ = visible_device(uuid);
  DeviceScope scope(device_);
  try {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, memory_handle.data(), sizeof(h));
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    data_ = static_cast<std::byte*>(p);
    for (const std::string& eh : event_handles) {
      if (eh.size() != kHandleBytes) throw CudaError("batchcast: bad event handle");
      cudaIpcEventHandle_t h;
      std::memcpy(&h, eh.data(), sizeof(h));
      cudaEvent_t e = nullptr;
      check(cudaIpcOpenEventHandle(&e, h), "cudaIpcOpenEventHandle");
      events_.push_back(e);
    }
  } catch (...) {
    close_all();
    throw;
  }
}

ImportedRing::~ImportedRing() { close_all(); }

void ImportedRing::close_all() {
  DeviceScope scope(device_, false);
  for (void* e : events_) cudaEventDestroy(as_event(e));
  events_.clear();
  if (data_ != nullptr) cudaIpcCloseMemHandle(data_);
  data_ = nullptr;
  cudaGetLastError();
}

// ---- ReleaseWaiter --------------------------------------------------------

struct ReleaseWaiter::State {
  int device = 0;
  std::function<void(uint64_t)> done;
  std::mutex mu;
  std::condition_variable changed;
  std::deque<std::pair<uint64_t, cudaEvent_t>> queue;
  std::vector<cudaEvent_t> pool;
  std::vector<cudaEvent_t> all;
  int64_t in_progress = 0;
  bool quit = false;
  std::thread thread;

  void run() {
    cudaSetDevice(device);
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      changed.wait(lock, [&] { return quit || !queue.empty(); });
      if (queue.empty()) return;  // quit, and nothing is left to wait for
      auto [seq, event] = queue.front();
      queue.pop_front();
      in_progress += 1;
      lock.unlock();
      // On error (teardown) the slot is released anyway.
      if (event != nullptr) {
        cudaEventSynchronize(event);
      } else {
        cudaDeviceSynchronize();  // release_after="device": all of this process's work so far
      }
      cudaGetLastError();
      done(seq);
      lock.lock();
      in_progress -= 1;
      if (event != nullptr) pool.push_back(event);
      changed.notify_all();
    }
  }
};

ReleaseWaiter::ReleaseWaiter(int device, std::function<void(uint64_t)> done)
    : state_(std::make_shared<State>()) {
  state_->device = device;
  state_->done = std::move(done);
  state_->thread = start_background_thread([s = state_.get()] { s->run(); });
}

ReleaseWaiter::~ReleaseWaiter() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->quit = true;
  }
  state_->changed.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  DeviceScope scope(state_->device, false);
  for (cudaEvent_t e : state_->all) cudaEventDestroy(e);
  cudaGetLastError();
}

void* ReleaseWaiter::acquire() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->pool.empty()) {
    cudaEvent_t e = state_->pool.back();
    state_->pool.pop_back();
    return e;
  }
  DeviceScope scope(state_->device);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync), "cudaEventCreate");
  state_->all.push_back(e);
  return e;
}

void ReleaseWaiter::add(uint64_t seq, void* event) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.emplace_back(seq, as_event(event));
  }
  state_->changed.notify_all();
}

void ReleaseWaiter::discard(void* event) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pool.push_back(as_event(event));
}

int64_t ReleaseWaiter::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int64_t>(state_->queue.size()) + state_->in_progress;
}

}  // namespace batchcast::cuda
