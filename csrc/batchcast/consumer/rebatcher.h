// Turns the stream of loader batches of one epoch into batches of the
// consumer's own size, exactly once and in order. A consumer batch whose
// samples lie back to back in the ring is a view of shared memory; one that
// straddles a wrap of the ring is a single copy. Without a batch size it
// forwards each loader batch as it is. Samples of variable length (each
// loader batch padded to its own longest) are re-padded when one consumer
// batch joins loader batches whose padded shapes differ, for the leaves a
// pad value is declared for (Padding): one copy of that batch.
#pragma once


#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batchcast/common/batch.h"
#include "batchcast/common/fork.h"
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
// rebatcher while samples of the slot are pending. The last owner releases,
// in the process the token was made in: a forked child's copy of a tensor
// dying there gives nothing back (the slot is the parent's) and leaves the
// sink as it is (common/fork.h).
class ReleaseToken {
 public:
  ReleaseToken(uint64_t seq, std::shared_ptr<ReleaseSink> sink,
               std::optional<cuda::StreamRef> stream = std::nullopt)
      : seq_(seq), sink_(std::move(sink)), stream_(stream) {}
  ReleaseToken(const ReleaseToken&) = delete;
  ReleaseToken& operator=(const ReleaseToken&) = delete;
  ~ReleaseToken() {
    if (born_.here()) {
      sink_->release(seq_, stream_);
    } else {
      leave_behind(sink_);
    }
  }
  uint64_t seq() const { return seq_; }
  // The GPU stream the slot's memory is used on (set before it is used).
  void set_stream(const cuda::StreamRef& stream) { stream_ = stream; }

 private:
  uint64_t seq_;
  std::shared_ptr<ReleaseSink> sink_;
  std::optional<cuda::StreamRef> stream_;
  Birthplace born_;
};

// One announced loader batch whose tensors live at `base` + leaf offsets in
// the ring (on `device`), or, once spilled or copied to another device (no
// token: it holds no slot), in private tensors `owned`, indexed by leaf
// (undefined for list leaves).
struct LoaderBatch {
  protocol::Announcement announcement;
  const std::byte* base = nullptr;
  std::shared_ptr<ReleaseToken> token;
  std::vector<Tensor> owned;
  Device device = cpu_device();
  // Where the producer did not know the samples' dataset indices
  // (announcement.indices is empty), they are known by their positions in the
  // producer's epoch, the first `first_position` (a copy of some samples, as
  // padding, keeps theirs).
  int64_t first_position = 0;
  bool by_position() const { return announcement.indices.empty(); }
  bool spilled() const { return token == nullptr; }
};

struct RebatchStats {
  int64_t views = 0;     // tensors handed out as views of shared memory
  int64_t copies = 0;    // tensors that had to be concatenated (or re-padded)
  int64_t spills = 0;    // pending samples copied out to free ring slots
  int64_t repadded = 0;  // batches with a leaf re-padded to its samples' longest
};

// How leaves whose samples differ in shape between loader batches are
// joined into one consumer batch: padded on the trailing side of each
// dimension they differ in to the largest among its samples (rounded up to a
// multiple of `multiple_of`), with the leaf's pad value. Samples keep their
// values; the loader's own padding inside a loader batch stays as it was.
//
// Each named leaf by the keys that lead to it from the batch (dict keys,
// positions, field names, each as its text: layout::leaf_keys), with its pad
// value: {{"input_ids"}, 0}, {{"inputs", "ids"}, 0}, {{"0"}, -1}.
using PadLeaves = std::vector<std::pair<std::vector<std::string>, double>>;
struct Padding {
  PadLeaves leaves;
  std::optional<double> every;  // for every leaf not named
  int64_t multiple_of = 1;
  bool any() const { return every.has_value() || !leaves.empty(); }
};

// A rank of a consumer group: of each `world` * batch_size consecutive
// samples of the stream, this rank takes the `rank`-th batch_size.
struct GroupRank {
  int32_t rank = 0;
  int32_t world = 1;
};

class Rebatcher {
 public:
  // batch_size: samples per batch handed out; none: each loader batch as it is.
  // group: this consumer is one rank of a group (needs a batch_size).
  Rebatcher(std::optional<int64_t> batch_size, bool drop_last,
            std::optional<GroupRank> group = std::nullopt);

  // At most this many ring slots stay pending while a batch is incomplete;
  // beyond it the pending samples are copied out so that the producer, whose
  // ring is finite, can always make progress whatever the batch sizes.
  void set_max_pending(int64_t slots) { max_pending_ = slots; }
  int64_t max_pending() const { return max_pending_; }
  // Throws InvalidArgument for a multiple_of below 1. The leaves it names are
  // checked against the first batch's structure (a path that is no tensor
  // leaf with a dimension to pad is an InvalidArgument then).
  void set_padding(Padding padding);

  // A new epoch of `samples` samples (-1: not known yet), whose stream
  // positions before `skip` this consumer does not take (it resumes there).
  void begin_epoch(int64_t samples, int64_t skip = 0);
  // A consumer whose epochs begin at sample `joined_at` of the producer's
  // (it joined mid-epoch): stream positions count in its own epochs, and a
  // sample known by position is known by the producer's, (position +
  // joined_at) mod the epoch's samples.
  void set_joined_at(int64_t joined_at) { joined_at_ = joined_at; }
  void push(LoaderBatch batch);
  // The next batch, once its samples are buffered. A leaf whose samples lie
  // back to back in the ring is a RingView; the others are tensors of their
  // own (copies) or lists.
  // identities: compose each sample's identity (ViewBatch::indices); else
  // those are left empty (`indexed` is set either way).
  std::optional<ViewBatch> pop(bool identities = true);
  // At the end of an epoch of `samples` samples: what is left (the partial
  // remainder unless drop_last; a group rank's share of the tail window,
  // padded); empties the buffer.
  std::optional<ViewBatch> flush(int64_t samples, bool identities = true);
  void clear();

  int64_t buffered() const { return buffered_; }
  const RebatchStats& stats() const { return stats_; }
  // Ring slots held by loader batches still pending here.
  std::vector<uint64_t> pending_slots() const;
  // Ring slots the batch handed out last is a view of.
  const std::vector<uint64_t>& last_batch_slots() const { return last_slots_; }
  // Where this consumer stands in the epoch's stream: the position of the
  // first sample it has not taken yet (a group: where its next window starts).
  int64_t position() const;
  // Batches an epoch of `samples` samples gives (-1 when samples < 0).
  int64_t batches_for(int64_t samples) const;
  // The samples this consumer takes of an epoch of `samples` (a group rank:
  // its part, with its share of the padded tail window; -1 when samples < 0).
  int64_t samples_for(int64_t samples) const;

 private:
  struct Range {  // stream positions [begin, end) of the next batch
    int64_t begin = 0;
    int64_t end = 0;
    bool tail = false;  // the group's last, partial window: needs the epoch's end
  };
  std::optional<Range> next_range(int64_t samples) const;  // none: nothing more this epoch
  int64_t front_position() const;  // stream position of the first pending sample
  int64_t buffered_to() const;     // position after the last pending sample
  void drop_below(int64_t position);
  void keep_head(const LoaderBatch& batch);
  void pad(int64_t from, int64_t count);
  bool waiting() const;  // pending samples that cannot make a batch yet
  ViewBatch take(int64_t n, bool identities);
  void spill();
  // The pad value of each leaf of batches laid out as `layout` (none: not padded).
  const std::vector<std::optional<double>>& pad_values(const protocol::Announcement& a);

  std::optional<int64_t> batch_size_;
  bool drop_last_;
  std::optional<GroupRank> group_;
  std::vector<uint64_t> last_slots_;
  std::deque<LoaderBatch> pending_;
  int64_t front_used_ = 0;  // samples of pending_.front() already handed out
  int64_t buffered_ = 0;
  int64_t max_pending_ = 1 << 30;
  int64_t samples_ = -1;    // of the current epoch, when known
  int64_t skip_ = 0;
  int64_t joined_at_ = 0;
  int64_t end_ = 0;         // position after the last sample pushed (or skip_)
  int64_t windows_ = 0;     // a group's windows done this epoch
  int64_t progress_ = 0;    // a group's position: where its next window starts
  std::vector<LoaderBatch> head_;  // a group's first samples of the epoch, for padding
  int64_t head_samples_ = 0;
  RebatchStats stats_;
  Padding padding_;
  std::string padded_layout_;  // the layout pad_values_ is for
  std::vector<std::optional<double>> pad_values_;
};

}  // namespace batchcast
