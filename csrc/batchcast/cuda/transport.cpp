// The CUDA transport's rules, written against cuda::Runtime (runtime.h): the
// same code runs on a GPU and on the simulated device of the tests.
#include "batchcast/cuda/transport.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "batchcast/common/threads.h"
#include "batchcast/cuda/runtime.h"

namespace batchcast::cuda {

// Switches by making the device's primary context current, never with
// cudaSetDevice: that would also change the runtime's remembered device for
// the thread (torch.cuda.current_device()), which a thread without a current
// context keeps. Without the driver's context calls it falls back to
// cudaSetDevice and restores only the context.
DeviceScope::DeviceScope(int device, bool checked) {
  Runtime& rt = runtime();
  if (rt.context_switching() && rt.current_context(&previous_)) {
    void* target = rt.primary_context(device);
    if (target != nullptr) {
      if (target != previous_) {
        if (rt.set_current_context(target)) {
          saved_ = true;
        } else if (checked) {
          throw CudaError("batchcast: cannot make cuda:" + std::to_string(device) + "'s context current");
        }
      }
      return;
    }
  }
  saved_ = rt.current_context(&previous_);
  int current = -1;
  if (previous_ != nullptr && rt.current_device(&current) && current == device) {
    saved_ = false;  // already there: nothing to change or restore
    return;
  }
  try {
    rt.set_device(device);
  } catch (const CudaError&) {
    saved_ = false;
    if (checked) throw;
  }
}

// Restores the thread's context exactly, "none" included: a thread that never
// used a GPU is left without one, instead of being moved to device 0 (whose
// context would be created) or left on the ring's device.
DeviceScope::~DeviceScope() {
  if (saved_) runtime().set_current_context(previous_);
}

bool built() { return runtime().built(); }
bool simulating() { return runtime().simulated(); }
bool device_memory_on_host() { return runtime().device_memory_on_host(); }
int device_count() { return runtime().device_count(); }
std::string device_uuid(int device) { return runtime().device_uuid(device); }

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

bool can_access_peer(int device, int peer) { return runtime().can_access_peer(device, peer); }

// ---- DeviceRing -----------------------------------------------------------

DeviceRing::DeviceRing(int device, uint64_t bytes, int events) : device_(device), bytes_(bytes) {
  if (device < 0 || device >= device_count()) {
    throw CudaError("batchcast: cuda:" + std::to_string(device) + " is not a device this process can see (" +
                    std::to_string(device_count()) + " visible)");
  }
  Runtime& rt = runtime();
  DeviceScope scope(device_);
  try {
    data_ = static_cast<std::byte*>(rt.device_alloc(bytes_));
    stream_ = rt.stream_create();
    for (int i = 0; i < events; ++i) {
      events_.push_back(rt.event_create(Runtime::kInterprocess));
      // Recorded once, so that waiting on a never-used slot event is a no-op.
      rt.event_record(events_.back(), stream_);
    }
    for (Staging& s : staging_) s.done = rt.event_create(Runtime::kBlockingSync);
  } catch (...) {
    free_all();
    throw;
  }
}

DeviceRing::~DeviceRing() { free_all(); }

void DeviceRing::free_all() {
  Runtime& rt = runtime();
  DeviceScope scope(device_, false);
  if (stream_ != nullptr) {
    try {
      rt.stream_synchronize(stream_);
    } catch (const CudaError&) {
    }
  }
  for (Staging& s : staging_) {
    if (s.data != nullptr) rt.host_free(s.data);
    if (s.done != nullptr) rt.event_destroy(s.done);
    s = Staging{};
  }
  for (void* e : events_) rt.event_destroy(e);
  events_.clear();
  if (stream_ != nullptr) rt.stream_destroy(stream_);
  stream_ = nullptr;
  if (data_ != nullptr) rt.device_free(data_);
  data_ = nullptr;
}

std::string DeviceRing::uuid() const { return device_uuid(device_); }

std::string DeviceRing::memory_handle() const {
  DeviceScope scope(device_);
  return runtime().memory_handle(data_);
}

std::vector<std::string> DeviceRing::event_handles() const {
  DeviceScope scope(device_);
  std::vector<std::string> out;
  for (void* e : events_) out.push_back(runtime().event_handle(e));
  return out;
}

// Per batch, only stream-ordered calls on the ring's own stream and events.
// They work whichever device is current, but need a current context: with
// none the runtime binds one implicitly and leaves it current, so the caller
// (CudaRing::write) makes them inside a DeviceScope of the ring's device.
std::byte* DeviceRing::staging(uint64_t bytes) {
  Runtime& rt = runtime();
  Staging& s = staging_[current_];
  rt.event_synchronize(s.done);
  if (s.bytes < bytes) {
    DeviceScope scope(device_);
    if (s.data != nullptr) rt.host_free(s.data);
    s.data = nullptr;
    s.bytes = 0;
    s.data = static_cast<std::byte*>(rt.host_alloc(bytes));
    s.bytes = bytes;
    // Fault the pinned pages in now, not during the first batch's copy.
    std::memset(s.data, 0, bytes);
  }
  if (const int64_t us = test_ring_delay_us(); us > 0) {
    // Tests: the ring's stream falls behind the host before this batch's copies.
    rt.launch_host_function(stream_, [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); });
  }
  return s.data;
}

void DeviceRing::copy_in(const std::byte* staged, uint64_t ring_offset, uint64_t bytes) {
  if (bytes == 0) return;
  if (ring_offset > bytes_ || bytes > bytes_ - ring_offset) throw InvalidArgument("copy outside the ring");
  runtime().copy_async(data_ + ring_offset, staged, bytes, Runtime::Copy::HostToDevice, stream_);
}

void DeviceRing::record_slot(int event) {
  runtime().event_record(events_.at(static_cast<std::size_t>(event)), stream_);
}

void DeviceRing::finish_staging() {
  runtime().event_record(staging_[current_].done, stream_);
  current_ ^= 1;
}

void DeviceRing::synchronize() { runtime().stream_synchronize(stream_); }

// ---- ImportedRing ---------------------------------------------------------

ImportedRing::ImportedRing(const std::string& uuid, const std::string& memory_handle, uint64_t bytes,
                           const std::vector<std::string>& event_handles)
    : bytes_(bytes) {
  if (memory_handle.size() != kHandleBytes) throw CudaError("batchcast: bad memory handle");
  device_ = visible_device(uuid);
  Runtime& rt = runtime();
  DeviceScope scope(device_);
  try {
    data_ = static_cast<std::byte*>(rt.open_memory_handle(memory_handle));
    for (const std::string& eh : event_handles) {
      if (eh.size() != kHandleBytes) throw CudaError("batchcast: bad event handle");
      events_.push_back(rt.open_event_handle(eh));
    }
  } catch (...) {
    close_all();
    throw;
  }
}

ImportedRing::~ImportedRing() { close_all(); }

void ImportedRing::close_all() {
  Runtime& rt = runtime();
  DeviceScope scope(device_, false);
  for (void* e : events_) rt.event_destroy(e);
  events_.clear();
  if (data_ != nullptr) rt.close_memory_handle(data_);
  data_ = nullptr;
}

// ---- ReleaseWaiter --------------------------------------------------------

struct ReleaseWaiter::State {
  int device = 0;
  std::function<void(uint64_t)> done;
  std::mutex mu;
  std::condition_variable changed;
  std::deque<std::pair<uint64_t, Event>> queue;
  std::vector<Event> pool;
  std::vector<Event> all;
  int64_t in_progress = 0;
  bool quit = false;
  std::thread thread;

  void run() {
    // The waiting calls need a current context: the ring's device's, on this
    // thread of batchcast's own, for its whole life.
    DeviceScope scope(device, /*checked=*/false);
    Runtime& rt = runtime();
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      changed.wait(lock, [&] { return quit || !queue.empty(); });
      if (queue.empty()) return;  // quit, and nothing is left to wait for
      auto [seq, event] = queue.front();
      queue.pop_front();
      in_progress += 1;
      lock.unlock();
      // On error (teardown) the slot is released anyway.
      try {
        if (event != nullptr) {
          rt.event_synchronize(event);
        } else {
          rt.device_synchronize();  // release_after="device": all of this process's work so far
        }
      } catch (const CudaError&) {
      }
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
  state_->thread = start_background_thread("batchcast-gpu", [s = state_.get()] { s->run(); });
}

ReleaseWaiter::~ReleaseWaiter() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->quit = true;
  }
  state_->changed.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  DeviceScope scope(state_->device, false);
  for (Event e : state_->all) runtime().event_destroy(e);
}

void* ReleaseWaiter::acquire() {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->pool.empty()) {
    Event e = state_->pool.back();
    state_->pool.pop_back();
    return e;
  }
  DeviceScope scope(state_->device);
  Event e = runtime().event_create(Runtime::kBlockingSync);
  state_->all.push_back(e);
  return e;
}

void ReleaseWaiter::add(uint64_t seq, void* event) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.emplace_back(seq, event);
  }
  state_->changed.notify_all();
}

void ReleaseWaiter::discard(void* event) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pool.push_back(event);
}

int64_t ReleaseWaiter::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return static_cast<int64_t>(state_->queue.size()) + state_->in_progress;
}

}  // namespace batchcast::cuda
