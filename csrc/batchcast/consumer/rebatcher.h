// Turns the stream of loader batches of one epoch into batches of the
// consumer's own size, exactly once and in order. A consumer batch whose
// samples lie back to back in the ring is a view of shared memory; one that
// straddles a wrap of the ring is a single copy. Without a batch size it
// forwards each loader batch as it is.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "batchcast/common/batch.h"
#include "batchcast/cuda/runtime.h"
#include "batchcast/protocol/message.h"

namespace batchcast {

// Told when no tensor or pending batch references a ring slot any more. For a
// GPU ring, `stream` is the stream the slot's memory was used on: the slot
// goes back only once that stream has passed this point.
class ReleaseSink {
 public:
  virtual ~ReleaseSink() = default;
  virtual void release(uint64_t seq, const std::optional<cuda::StreamRef>& stream) noexcept = 0;
};

// Held by every tensor viewing a slot (through its deleter) and by the
// rebatcher while samples of the slot are pending. The last owner releases.
class ReleaseToken {
 public:
  ReleaseToken(uint64_t seq, std::shared_ptr<ReleaseSink> sink,
               std::optional<cuda::StreamRef> stream = std::nullopt)
      : seq_(seq), sink_(std::move(sink)), stream_(stream) {}
  ReleaseToken(const ReleaseToken&) = delete;
  ReleaseToken& operator=(const ReleaseToken&) = delete;
  ~ReleaseToken() { sink_->release(seq_, stream_); }
  uint64_t seq() const { return seq_; }
  // The GPU stream the slot's memory is used on (set before it is used).
  void set_stream(const cuda::StreamRef& stream) { stream_ = stream; }

 private:
  uint64_t seq_;
  std::shared_ptr<ReleaseSink> sink_;
  std::optional<cuda::StreamRef> stream_;
};

// One announced loader batch whose tensors live at `base` + leaf offsets in
// the ring (on `device`), or, once spilled or copied to another device (no
// token: it holds no slot), in private tensors `owned`, indexed by leaf
// (undefined for list leaves).
struct LoaderBatch {
  protocol::Announcement announcement;
  const std::byte* base = nullptr;
  std::shared_ptr<ReleaseToken> token;
  std::vector<at::Tensor> owned;
  c10::Device device = c10::kCPU;
  bool spilled() const { return token == nullptr; }
};

struct RebatchStats {
  int64_t views = 0;   // tensors handed out as views of shared memory
  int64_t copies = 0;  // tensors that had to be concatenated
  int64_t spills = 0;  // pending samples copied out to free ring slots
};

class Rebatcher {
 public:
  // batch_size: samples per batch handed out; none: each loader batch as it is.
  Rebatcher(std::optional<int64_t> batch_size, bool drop_last);

  // At most this many ring slots stay pending while a batch is incomplete;
  // beyond it the pending samples are copied out so that the producer, whose
  // ring is finite, can always make progress whatever the batch sizes.
  void set_max_pending(int64_t slots) { max_pending_ = slots; }

  void push(LoaderBatch batch);
  // A full batch, once `batch_size` samples are buffered.
  std::optional<Batch> pop();
  // At the end of an epoch: the partial remainder (none if drop_last); empties the buffer.
  std::optional<Batch> flush();
  void clear();

  int64_t buffered() const { return buffered_; }
  const RebatchStats& stats() const { return stats_; }
  // Ring slots held by loader batches still pending here.
  std::vector<uint64_t> pending_slots() const;
  // Ring slots the batch handed out last is a view of.
  const std::vector<uint64_t>& last_batch_slots() const { return last_slots_; }

 private:
  Batch take(int64_t n);
  void spill();

  std::optional<int64_t> batch_size_;
  bool drop_last_;
  std::vector<uint64_t> last_slots_;
  std::deque<LoaderBatch> pending_;
  int64_t front_used_ = 0;  // samples of pending_.front() already handed out
  int64_t buffered_ = 0;
  int64_t max_pending_ = 1 << 30;
  RebatchStats stats_;
};

}  // namespace batchcast
