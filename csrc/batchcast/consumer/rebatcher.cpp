#include "batchcast/consumer/rebatcher.h"

#include <sstream>

#include "batchcast/common/error.h"
#include "batchcast/consumer/layout.h"
#include "batchcast/protocol/dtype.h"

namespace batchcast {
namespace {

using protocol::from_wire;

struct Piece {
  const LoaderBatch* batch;
  int64_t start;
  int64_t count;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 1; i < shape.size(); ++i) s << (i > 1 ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

// A private copy of samples [from, from + count) of `b`, holding no slot.
LoaderBatch copy_rows(const LoaderBatch& b, int64_t from, int64_t count) {
  LoaderBatch copy;
  copy.announcement = b.announcement;
  copy.announcement.samples = count;
  copy.announcement.position = b.announcement.position + from;
  if (!b.announcement.indices.empty()) {
    copy.announcement.indices.assign(b.announcement.indices.begin() + from,
                                     b.announcement.indices.begin() + from + count);
  }
  copy.first_position = b.first_position + from;
  for (std::size_t j = 0; j < b.announcement.leaves.size(); ++j) {
    if (const auto* t = std::get_if<protocol::TensorLeaf>(&b.announcement.leaves[j])) {
      if (b.spilled()) {
        copy.owned.push_back(clone(narrow(b.owned[j], 0, from, count)));
      } else {
        std::vector<int64_t> shape = t->shape;
        const uint64_t row = t->nbytes() / static_cast<uint64_t>(std::max<int64_t>(shape[0], 1));
        shape[0] = count;
        auto* at_row = const_cast<std::byte*>(b.base + t->offset + static_cast<uint64_t>(from) * row);
        copy.owned.push_back(clone(borrow(at_row, shape, from_wire(t->dtype), b.device)));
      }
      std::get<protocol::TensorLeaf>(copy.announcement.leaves[j]).shape[0] = count;
    } else {
      auto& items = std::get<protocol::ListLeaf>(copy.announcement.leaves[j]).items;
      items = std::vector<std::string>(items.begin() + from, items.begin() + from + count);
      copy.owned.emplace_back();  // keeps leaf indices aligned
    }
  }
  copy.device = b.device;
  return copy;
}

// Samples of two loader batches go into one consumer batch only if the two
// have one structure: the same containers, keys, leaves and values beside the
// samples (a reordered dict is laid out in one order by the producer), and
// per-sample lists of one kind. Anything else would hand out one leaf's
// values under another's name, or drop a value: refused, saying what changed.
void check_same_structure(const protocol::Announcement& first, const protocol::Announcement& other) {
  auto refuse = [&](const std::string& what) {
    throw RebatchError(
        "cannot rebatch loader batch " + std::to_string(other.index) + " of epoch " +
        std::to_string(other.epoch) + " with loader batch " + std::to_string(first.index) +
        " before it: its structure changed (" + what +
        "), and one consumer batch takes samples of both. Make the loader yield one structure "
        "(the same containers, keys, dtypes and values beside the samples), or use batch_size=None "
        "to receive the loader's batches as they are");
  };
  if (auto change = layout::describe_change(first.layout, other.layout)) refuse(*change);
  if (other.leaves.size() != first.leaves.size()) {
    refuse(std::to_string(first.leaves.size()) + " leaves became " + std::to_string(other.leaves.size()));
  }
  for (std::size_t j = 0; j < first.leaves.size(); ++j) {
    if (other.leaves[j].index() != first.leaves[j].index()) refuse("a tensor and a per-sample list swapped places");
    const auto* a = std::get_if<protocol::ListLeaf>(&first.leaves[j]);
    const auto* b = std::get_if<protocol::ListLeaf>(&other.leaves[j]);
    if (a != nullptr && a->kind != b->kind) {
      refuse("at " + layout::leaf_path(first.layout, j) + ": " +
             (a->kind == ListKind::Text ? "a list of strings became a list of other values"
                                        : "a list of values became a list of strings"));
    }
  }
}

}  // namespace

Rebatcher::Rebatcher(std::optional<int64_t> batch_size, bool drop_last, std::optional<GroupRank> group)
    : batch_size_(batch_size), drop_last_(drop_last), group_(group) {
  if (batch_size_ && *batch_size_ <= 0) throw InvalidArgument("batch_size must be a positive int");
  if (group_ && !batch_size_) throw InvalidArgument("a consumer group needs a batch_size");
  if (group_ && (group_->world < 1 || group_->rank < 0 || group_->rank >= group_->world)) {
    throw InvalidArgument("rank must be in [0, world_size)");
  }
}

void Rebatcher::set_padding(Padding padding) {
  if (padding.multiple_of < 1) throw InvalidArgument("a pad's multiple_of must be a positive int");
  padding_ = std::move(padding);
  padded_layout_.clear();
  pad_values_.clear();
}

// Worked out once per structure of the loader's batches; the leaves the
// padding names are checked against it here.
const std::vector<std::optional<double>>& Rebatcher::pad_values(const protocol::Announcement& a) {
  if (!pad_values_.empty() && padded_layout_ == a.layout) return pad_values_;
  std::vector<std::optional<double>> values(a.leaves.size());
  if (!padding_.any()) {  // nothing declared: no leaf is padded
    padded_layout_ = a.layout;
    pad_values_ = std::move(values);
    return pad_values_;
  }
  std::string keys;  // every leaf's, as a user writes them
  std::map<std::vector<std::string>, std::size_t> leaf_of;
  for (std::size_t j = 0; j < a.leaves.size(); ++j) {
    keys += (keys.empty() ? "" : ", ") + layout::leaf_key(a.layout, j);
    leaf_of[layout::leaf_keys(a.layout, j)] = j;
    if (padding_.every && std::holds_alternative<protocol::TensorLeaf>(a.leaves[j])) values[j] = padding_.every;
  }
  for (const auto& [named, value] : padding_.leaves) {
    auto it = leaf_of.find(named);
    std::string path;  // as the user named it, for the message
    for (const auto& key : named) path += (path.empty() ? "" : "/") + key;
    if (it == leaf_of.end()) {
      throw InvalidArgument("pad names " + path + ", which is not a leaf of the loader's batches (their leaves: " +
                            keys + "); name a leaf by its key in the batch's dict, or by a tuple of keys for "
                            "one deeper inside");
    }
    path = layout::leaf_path(a.layout, it->second);
    const auto* t = std::get_if<protocol::TensorLeaf>(&a.leaves[it->second]);
    if (t == nullptr) {
      throw InvalidArgument("pad names " + path + ", which is a list of values per sample, not a tensor: "
                            "nothing to pad; remove it from pad=");
    }
    if (t->shape.size() < 2) {
      throw InvalidArgument("pad names " + path + ", whose samples are single values (shape " +
                            shape_text(t->shape) + " per sample): nothing to pad; remove it from pad=");
    }
    values[it->second] = value;
  }
  padded_layout_ = a.layout;
  pad_values_ = std::move(values);
  return pad_values_;
}

std::vector<uint64_t> Rebatcher::pending_slots() const {
  std::vector<uint64_t> out;
  for (const LoaderBatch& b : pending_) {
    if (!b.spilled()) out.push_back(b.token->seq());
  }
  return out;
}

void Rebatcher::begin_epoch(int64_t samples, int64_t skip) {
  clear();
  samples_ = samples;
  skip_ = std::max<int64_t>(skip, 0);
  end_ = skip_;
  windows_ = 0;
  progress_ = skip_;
  if (group_) windows_ = skip_ / (group_->world * *batch_size_);  // a group resumes at a window
}

int64_t Rebatcher::front_position() const {
  return pending_.front().announcement.position + front_used_;
}

int64_t Rebatcher::buffered_to() const {
  if (pending_.empty()) return end_;
  const auto& a = pending_.back().announcement;
  return a.position + a.samples;
}

int64_t Rebatcher::position() const {
  if (group_) return progress_;
  return pending_.empty() ? end_ : front_position();
}

int64_t Rebatcher::batches_for(int64_t samples) const {
  if (samples < 0 || !batch_size_) return -1;
  const int64_t b = *batch_size_;
  if (!group_) return drop_last_ ? samples / b : (samples + b - 1) / b;
  const int64_t window = group_->world * b;
  return samples / window + (samples % window != 0 && !drop_last_ ? 1 : 0);
}

int64_t Rebatcher::samples_for(int64_t samples) const {
  if (samples < 0 || !group_) return samples;
  const int64_t b = *batch_size_;
  const int64_t window = group_->world * b;
  const int64_t rest = samples % window;
  const int64_t tail = rest != 0 && !drop_last_ ? (rest + group_->world - 1) / group_->world : 0;
  return samples / window * b + tail;
}

// The stream positions of this consumer's next batch, for an epoch of
// `samples` samples (-1: unknown, so every window is taken to be whole). Of
// each window of world * batch_size samples, rank r takes the r-th batch. The
// last, partial window (unless drop_last) is padded up to a multiple of the
// world size with the epoch's first samples, and each rank takes an equal part.
std::optional<Rebatcher::Range> Rebatcher::next_range(int64_t samples) const {
  const int64_t b = *batch_size_;
  const int64_t window = group_->world * b;
  const int64_t start = windows_ * window;
  if (samples >= 0 && start >= samples) return std::nullopt;
  if (samples < 0 || start + window <= samples) {
    return Range{start + group_->rank * b, start + (group_->rank + 1) * b, false};
  }
  if (drop_last_) return std::nullopt;
  const int64_t part = (samples - start + group_->world - 1) / group_->world;
  return Range{start + group_->rank * part, start + (group_->rank + 1) * part, true};
}

void Rebatcher::drop_below(int64_t position) {
  while (!pending_.empty() && front_position() < position) {
    const int64_t avail = pending_.front().announcement.samples - front_used_;
    const int64_t n = std::min(avail, position - front_position());
    buffered_ -= n;
    if (n == avail) {
      pending_.pop_front();  // its token goes: the slot may be released
      front_used_ = 0;
    } else {
      front_used_ += n;
    }
  }
}

// A group pads its last window with the epoch's first samples (those it
// took: after a resume, its first samples from the resume position on), so
// it copies the first world - 1 of them as they pass.
void Rebatcher::keep_head(const LoaderBatch& batch) {
  const int64_t need = group_->world - 1 - head_samples_;
  if (need <= 0) return;
  const int64_t from = std::max<int64_t>(0, skip_ - batch.announcement.position);
  if (from >= batch.announcement.samples) return;
  const int64_t count = std::min(need, batch.announcement.samples - from);
  head_.push_back(copy_rows(batch, from, count));
  head_samples_ += count;
}

// Appends `count` padding samples at stream positions from `from` on
// (>= the epoch's end): position p holds head sample (p - end) mod head size.
void Rebatcher::pad(int64_t from, int64_t count) {
  if (head_samples_ == 0) return;
  int64_t j = (from - samples_) % head_samples_;
  int64_t at = from;
  while (count > 0) {
    int64_t offset = 0;
    const LoaderBatch* piece = nullptr;
    for (const LoaderBatch& h : head_) {
      if (j < offset + h.announcement.samples) {
        piece = &h;
        break;
      }
      offset += h.announcement.samples;
    }
    const int64_t n = std::min(count, piece->announcement.samples - (j - offset));
    LoaderBatch part = copy_rows(*piece, j - offset, n);
    part.announcement.position = at;
    buffered_ += n;
    end_ = std::max(end_, at + n);
    pending_.push_back(std::move(part));
    at += n;
    count -= n;
    j = (j + n) % head_samples_;
  }
}

bool Rebatcher::waiting() const {
  if (!batch_size_) return false;  // forward: every loader batch goes out at once
  if (!group_) return buffered_ < *batch_size_;
  auto range = next_range(samples_);
  if (!range) return false;  // nothing more is taken: what comes is dropped
  if (range->tail || samples_ < 0) return true;  // held until the epoch or the window ends
  return buffered_to() < range->end;
}

void Rebatcher::push(LoaderBatch batch) {
  const int64_t position = batch.announcement.position;
  const int64_t samples = batch.announcement.samples;
  // The identity of its first sample, if known by position: the producer's
  // position (a loader batch never spans the producer's epochs).
  batch.first_position = joined_at_ > 0 && samples_ > 0 ? (position + joined_at_) % samples_ : position;
  end_ = std::max(end_, position + samples);
  if (!batch_size_ && samples == 0 && position >= skip_) {
    pending_.push_back(std::move(batch));  // forwarded as it is: the loader yielded it
    return;
  }
  if (samples == 0 || position + samples <= skip_) return;  // nothing of it is ours: released now
  if (group_) keep_head(batch);
  buffered_ += samples;
  pending_.push_back(std::move(batch));
  drop_below(skip_);
  if (group_ && samples_ >= 0) {
    if (auto range = next_range(samples_)) drop_below(range->begin);  // other ranks' samples
  }
  if (waiting()) {
    int64_t in_ring = 0;
    for (const LoaderBatch& b : pending_) in_ring += b.spilled() ? 0 : 1;
    if (in_ring > max_pending_) spill();
  }
}

void Rebatcher::spill() {
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    LoaderBatch& b = pending_[k];
    if (b.spilled()) continue;
    const int64_t used = k == 0 ? front_used_ : 0;
    b = copy_rows(b, used, b.announcement.samples - used);  // without the token: the slot can go
    if (k == 0) front_used_ = 0;
  }
  stats_.spills += 1;
}

std::optional<ViewBatch> Rebatcher::pop(bool identities) {
  if (!batch_size_) {  // forward: one loader batch, whole
    if (pending_.empty()) return std::nullopt;
    return take(pending_.front().announcement.samples - front_used_, identities);
  }
  if (!group_) {
    if (buffered_ < *batch_size_) return std::nullopt;
    return take(*batch_size_, identities);
  }
  auto range = next_range(samples_);
  if (!range) {
    drop_below(buffered_to());  // the epoch has nothing more for this rank
    return std::nullopt;
  }
  const int64_t window_end = (windows_ + 1) * group_->world * *batch_size_;
  if (range->tail) {
    drop_below(range->begin);
    return std::nullopt;  // the tail goes out at the epoch's end
  }
  // With the epoch's length unknown, the window may turn out to be the last,
  // partial one: nothing of it is dropped before the stream has passed it.
  if (samples_ < 0 && buffered_to() < window_end) return std::nullopt;
  drop_below(range->begin);
  if (buffered_to() < range->end) return std::nullopt;
  ViewBatch out = take(range->end - range->begin, identities);
  windows_ += 1;
  progress_ = window_end;
  drop_below(window_end);  // the other ranks' samples of this window
  return out;
}

std::optional<ViewBatch> Rebatcher::flush(int64_t samples, bool identities) {
  std::optional<ViewBatch> out;
  samples_ = samples;
  if (!group_) {
    if (buffered_ > 0 && !drop_last_) out = take(buffered_, identities);
  } else if (auto range = next_range(samples)) {
    drop_below(range->begin);
    if (buffered_to() >= std::min(range->end, samples)) {
      if (range->end > samples) {
        const int64_t from = std::max(range->begin, samples);
        pad(from, range->end - from);
      }
      const int64_t n = std::min(buffered_, range->end - range->begin);
      if (n > 0) out = take(n, identities);
      windows_ += 1;
    }
    progress_ = samples;
  } else {
    progress_ = std::max(progress_, samples);
  }
  clear();
  return out;
}

void Rebatcher::clear() {
  pending_.clear();
  front_used_ = 0;
  buffered_ = 0;
  head_.clear();
  head_samples_ = 0;
}

ViewBatch Rebatcher::take(int64_t n, bool identities) {
  std::vector<Piece> pieces;
  int64_t need = n;
  int64_t used = front_used_;
  for (const LoaderBatch& b : pending_) {
    int64_t count = std::min(need, b.announcement.samples - used);
    pieces.push_back(Piece{&b, used, count});
    need -= count;
    used = 0;
    if (need == 0) break;
  }

  last_slots_.clear();
  for (const Piece& p : pieces) {
    if (!p.batch->spilled()) last_slots_.push_back(p.batch->token->seq());
  }
  const protocol::Announcement& first = pieces.front().batch->announcement;
  ViewBatch out;
  out.epoch = first.epoch;
  out.samples = n;
  out.layout = first.layout;
  out.indexed = true;
  for (const Piece& p : pieces) out.indexed = out.indexed && !p.batch->by_position();
  if (identities) {
    out.indices.reserve(static_cast<std::size_t>(n));
    for (const Piece& p : pieces) {
      const protocol::Announcement& a = p.batch->announcement;
      if (p.batch->by_position()) {
        for (int64_t i = 0; i < p.count; ++i) out.indices.push_back(p.batch->first_position + p.start + i);
      } else {
        out.indices.insert(out.indices.end(), a.indices.begin() + p.start, a.indices.begin() + p.start + p.count);
      }
    }
  }
  for (std::size_t k = 1; k < pieces.size(); ++k) {
    check_same_structure(pieces[k - 1].batch->announcement, pieces[k].batch->announcement);
  }
  const std::vector<std::optional<double>>& pad_of = pad_values(first);
  bool repadded = false;
  for (std::size_t j = 0; j < first.leaves.size(); ++j) {
    if (const auto* t0 = std::get_if<protocol::TensorLeaf>(&first.leaves[j])) {
      const uint64_t elem = protocol::element_size(t0->dtype);
      auto row_of = [&](const protocol::TensorLeaf& t) {
        uint64_t row = elem;
        for (std::size_t d = 1; d < t.shape.size(); ++d) row *= static_cast<uint64_t>(t.shape[d]);
        return row;
      };
      bool any_spilled = false;
      auto start_of = [&](const Piece& p) {
        const auto& t = std::get<protocol::TensorLeaf>(p.batch->announcement.leaves[j]);
        const std::byte* first_row =
            p.batch->spilled() ? static_cast<const std::byte*>(p.batch->owned[j].data_ptr())
                               : p.batch->base + t.offset;
        return const_cast<std::byte*>(first_row + static_cast<uint64_t>(p.start) * row_of(t));
      };
      for (const Piece& p : pieces) any_spilled |= p.batch->spilled();
      bool contiguous = true;
      bool same_shape = true;
      const std::byte* expect = nullptr;
      for (const Piece& p : pieces) {
        const auto& t = std::get<protocol::TensorLeaf>(p.batch->announcement.leaves[j]);
        const bool same = std::equal(t.shape.begin() + 1, t.shape.end(), t0->shape.begin() + 1, t0->shape.end());
        const bool paddable = pad_of[j].has_value() && t.shape.size() == t0->shape.size();
        if (t.dtype != t0->dtype || (!same && !paddable)) {
          const std::string key = layout::leaf_key(first.layout, j);
          throw RebatchError(
              "cannot rebatch " + layout::leaf_path(first.layout, j) + ": loader batch " +
              std::to_string(first.index) + " of epoch " + std::to_string(first.epoch) +
              " has samples of shape " + shape_text(t0->shape) + " " + protocol::dtype_name(t0->dtype) +
              " but loader batch " + std::to_string(p.batch->announcement.index) + " has " +
              shape_text(t.shape) + " " + protocol::dtype_name(t.dtype) +
              ", and one consumer batch takes samples of both; " +
              (t.dtype != t0->dtype || t.shape.size() != t0->shape.size()
                   ? std::string("make every sample of a leaf the same dtype and number of dimensions, or use "
                                 "batch_size=None to receive the loader's batches as they are")
                   : "declare its pad value, Consumer(..., pad={" + key +
                         ": 0}), to have it padded to its longest sample in each batch; or pad every sample to "
                         "one shape in the collate_fn, or use batch_size=None to receive the loader's batches "
                         "as they are"));
        }
        same_shape = same_shape && same;
        if (expect != nullptr && start_of(p) != expect) contiguous = false;
        expect = start_of(p) + static_cast<uint64_t>(p.count) * row_of(t);
      }
      const Device device = pieces.front().batch->device;
      const ScalarType dtype = from_wire(t0->dtype);
      auto piece_tensor = [&](const Piece& p) {
        if (p.batch->spilled()) return narrow(p.batch->owned[j], 0, p.start, p.count);
        std::vector<int64_t> shape = std::get<protocol::TensorLeaf>(p.batch->announcement.leaves[j]).shape;
        shape[0] = p.count;  // borrowed, copied below
        return borrow(start_of(p), shape, dtype, p.batch->device);
      };
      if (!same_shape) {  // each piece into the leading corner of one padded batch
        // The dimensions its samples differ in: to the largest, rounded up
        // (one they share, such as a feature count, stays as it is).
        std::vector<int64_t> shape = t0->shape;
        std::vector<bool> varies(shape.size(), false);
        for (const Piece& p : pieces) {
          const auto& t = std::get<protocol::TensorLeaf>(p.batch->announcement.leaves[j]);
          for (std::size_t d = 1; d < shape.size(); ++d) {
            varies[d] = varies[d] || t.shape[d] != shape[d];
            shape[d] = std::max(shape[d], t.shape[d]);
          }
        }
        const int64_t m = padding_.multiple_of;
        for (std::size_t d = 1; d < shape.size(); ++d) shape[d] = varies[d] ? (shape[d] + m - 1) / m * m : shape[d];
        shape[0] = n;
        Tensor padded = full(shape, *pad_of[j], dtype, device);
        int64_t at_row = 0;
        for (const Piece& p : pieces) {
          Tensor src = piece_tensor(p);
          Tensor dst = narrow(padded, 0, at_row, p.count);
          for (int64_t d = 1; d < src.dim(); ++d) dst = narrow(dst, d, 0, src.size(d));
          copy_into(dst, src);
          at_row += p.count;
        }
        out.leaves.emplace_back(std::move(padded));
        stats_.copies += 1;
        repadded = true;
        continue;
      }
      // A view holds every slot it spans while the trainer has it: wider than
      // what this consumer may hold pending, it could take the flow's whole
      // room (a small ring, small loader batches): one copy instead.
      if (static_cast<int64_t>(pieces.size()) > max_pending_ + 1) contiguous = false;
      std::vector<int64_t> shape = t0->shape;
      if (pieces.size() == 1 && any_spilled) {  // spilled samples: a view of the private copy
        out.leaves.emplace_back(narrow(pieces[0].batch->owned[j], 0, pieces[0].start, pieces[0].count));
      } else if (contiguous && !any_spilled) {
        // One view over every piece; it keeps each piece's slot until freed.
        std::shared_ptr<const void> keep = pieces.front().batch->token;
        if (pieces.size() > 1) {
          auto tokens = std::make_shared<std::vector<std::shared_ptr<ReleaseToken>>>();
          for (const Piece& p : pieces) tokens->push_back(p.batch->token);
          keep = std::move(tokens);
        }
        shape[0] = n;
        out.leaves.emplace_back(RingView{start_of(pieces.front()), std::move(shape), dtype, device, std::move(keep)});
        stats_.views += 1;
      } else {
        std::vector<Tensor> parts;
        for (const Piece& p : pieces) parts.push_back(piece_tensor(p));
        out.leaves.emplace_back(cat_rows(parts));
        stats_.copies += 1;
      }
    } else {
      const auto& l0 = std::get<protocol::ListLeaf>(first.leaves[j]);
      Items items{l0.kind, {}};
      items.values.reserve(static_cast<std::size_t>(n));
      for (const Piece& p : pieces) {
        const auto& l = std::get<protocol::ListLeaf>(p.batch->announcement.leaves[j]);
        items.values.insert(items.values.end(), l.items.begin() + p.start,
                            l.items.begin() + p.start + p.count);
      }
      out.leaves.emplace_back(std::move(items));
    }
  }

  stats_.repadded += repadded ? 1 : 0;
  // Advance past what was handed out; fully used loader batches drop their token.
  if (n == 0) pending_.pop_front();  // an empty loader batch, forwarded
  int64_t left = n;
  while (left > 0) {
    int64_t avail = pending_.front().announcement.samples - front_used_;
    if (left >= avail) {
      left -= avail;
      pending_.pop_front();
      front_used_ = 0;
    } else {
      front_used_ += left;
      left = 0;
    }
  }
  buffered_ -= n;
  return out;
}

}  // namespace batchcast
