#include "batchcast/producer/join_plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

#include "batchcast/common/error.h"

namespace batchcast {

JoinPlanOptions JoinPlan::checked(JoinPlanOptions options) {
  if (options.samples_per_epoch < -1 || options.batches_per_epoch < -1) {
    throw InvalidArgument("samples_per_epoch and batches_per_epoch must be >= 0 (or -1: unknown)");
  }
  if (options.epochs < -1) throw InvalidArgument("epochs must be >= 0 (or -1: until stopped)");
  if (options.join_now && (options.samples_per_epoch <= 0 || options.batches_per_epoch <= 0)) {
    throw InvalidArgument("join_now needs samples_per_epoch and batches_per_epoch (a consumer's "
                          "epochs are that many samples from where it joined)");
  }
  if (options.catch_up_window < 0) throw InvalidArgument("catch_up_window must be >= 0");
  return options;
}

JoinPlan::JoinPlan(JoinPlanOptions options) : options_(checked(options)) {}

// ---- the stream ---------------------------------------------------------------

void JoinPlan::on_epoch_begin(int64_t epoch) {
  next_epoch_ = std::max(next_epoch_, epoch);  // newcomers may still take part until its first batch
}

int64_t JoinPlan::on_batch(int64_t epoch, int64_t index, int64_t samples) {
  if (epoch != epoch_) {
    if (epoch < epoch_) {
      throw std::logic_error("join plan: a batch of epoch " + std::to_string(epoch) + " after epoch " +
                             std::to_string(epoch_) + " began");
    }
    epoch_ = epoch;
    batches_ = 0;
    samples_ = 0;
  }
  if (index != batches_) {
    throw std::logic_error("join plan: batch " + std::to_string(index) + " of epoch " + std::to_string(epoch) +
                           " came as its batch " + std::to_string(batches_));
  }
  next_epoch_ = std::max(next_epoch_, epoch + 1);
  if (index == 0) loader_batch_samples_ = samples;
  batches_ += 1;
  const int64_t position = samples_;
  samples_ += samples;
  return position;
}

std::string JoinPlan::on_epoch_end(int64_t epoch, int64_t samples, int64_t batches) {
  epoch_ = -1;  // no epoch in progress: every newcomer gets the next
  last_ended_ = Ended{epoch, samples, batches};
  batches_ = 0;
  samples_ = 0;
  next_epoch_ = std::max(next_epoch_, epoch + 1);
  if (options_.samples_per_epoch < 0) options_.samples_per_epoch = samples;
  if (options_.batches_per_epoch < 0) options_.batches_per_epoch = batches;
  if (samples == options_.samples_per_epoch) return {};
  return "the producer's epoch " + std::to_string(epoch) + " had " + std::to_string(samples) + " samples, not " +
         std::to_string(options_.samples_per_epoch) +
         " as every epoch before: a consumer that joined mid-epoch cannot get every sample of its epochs "
         "exactly once (did the dataset's length change?)";
}

// ---- newcomers -----------------------------------------------------------------

StartPoint JoinPlan::start(const StartRequest& request, const std::function<bool(const Replay&)>& held) const {
  StartPoint s;
  s.frame = next_epoch_frame();
  if (request.resume_epoch >= 0 && !request.saved_in_this_run) {
    // Another run's epoch: where it stood within it is no place in this
    // run's passes. At its start (or after its end) every sample of an epoch
    // is still to come: this run's next epoch, whole, is exact.
    const int64_t whole = options_.samples_per_epoch;
    const bool between = request.resume_position == 0 || (whole > 0 && request.resume_position >= whole);
    s.resumed = between ? StartPoint::Resumed::Exact : StartPoint::Resumed::NextPass;
    s.position = between ? 0 : request.resume_position;
    s.other_run = !between;
    return s;
  }
  if (request.resume_epoch >= 0 && request.resume_joined_at > 0) {
    // An epoch of its own begun mid-epoch: exact where its order is kept and
    // the stream still has it from its position on.
    const ResumePoint r = resume_framed(request.resume_epoch, request.resume_position, request.resume_joined_at);
    if (r.possible && servable(r.at_epoch, r.at_position, /*own_end=*/false, s.replay, held)) {
      s.frame = r.frame;
      s.resumed = StartPoint::Resumed::Exact;
      s.position = r.position;
    } else {
      s.replay.reset();
      s.resumed = StartPoint::Resumed::NextPass;
      s.position = request.resume_position;
    }
    return s;
  }
  if (request.resume_epoch >= 0) {
    int64_t e = request.resume_epoch;
    int64_t pos = request.resume_position;
    if (last_ended_ && e == last_ended_->epoch && pos >= last_ended_->samples) {
      e += 1;  // saved after the last sample of an epoch that ended: the next one
      pos = 0;
    }
    s.position = pos;
    if (servable(e, pos, /*own_end=*/true, s.replay, held)) {
      s.frame.first_epoch = e;
      s.resumed = StartPoint::Resumed::Exact;
    } else {
      s.replay.reset();
      s.resumed = StartPoint::Resumed::NextPass;
    }
    return s;
  }
  if (request.catch_up && epoch_ >= 0) {
    const Replay whole{epoch_, 0, batches_, false};
    if (batches_ <= options_.catch_up_window && held(whole)) {
      s.frame.first_epoch = epoch_;
      s.replay = whole;
    } else {
      s.caught_up_too_late = true;
    }
  } else if (request.join_now) {
    if (auto now = join_now(s.why_not_now)) s.frame = *now;
  }
  return s;
}

// Sample `position` of the producer's epoch `epoch` on: the epoch in
// progress from there (held, or not served yet), the next one (not begun), or
// the rest of the epoch that ended last (held; with its end, if that is the
// trainer's own).
bool JoinPlan::servable(int64_t epoch, int64_t position, bool own_end, std::optional<Replay>& replay,
                        const std::function<bool(const Replay&)>& held) const {
  if (epoch_ >= 0 && epoch == epoch_) {
    if (position >= samples_) return true;  // nothing from there was served yet
    replay = Replay{epoch, position, batches_, false};
  } else if (epoch == next_epoch_) {
    return true;  // not begun: served from its start
  } else if (epoch_ < 0 && last_ended_ && epoch == last_ended_->epoch) {
    replay = Replay{epoch, position, last_ended_->batches, own_end};
  } else {
    return false;
  }
  return held(*replay);
}

// Mid-epoch, joining now: it starts with the next batch, its epochs begin
// where it joined. Between epochs it starts at the next, whole, as anyone.
std::optional<Frame> JoinPlan::join_now(std::string& why_not) const {
  const int64_t at = samples_;
  if (epoch_ < 0 || at <= 0) return std::nullopt;
  if (options_.samples_per_epoch >= 0 && at >= options_.samples_per_epoch) return std::nullopt;  // it ended
  if (!options_.join_now) {
    why_not = "its loader's order is not its to keep: an IterableDataset, a loader other than a DataLoader, "
              "or a sampler it cannot steer";
    return std::nullopt;
  }
  // Its epoch e ends in the producer's e + 1: with a last epoch, one of its
  // own must fit before it ends (else it starts at the next: there is none).
  if (options_.epochs >= 0 && epoch_ + 1 >= options_.epochs) return std::nullopt;
  const int64_t last = options_.epochs >= 0 ? options_.epochs - 2 : std::numeric_limits<int64_t>::max();
  return Frame{epoch_, at, batches_, last};
}

// Resuming an epoch of its own that began at sample q of the producer's
// epoch of its number: possible while the producer's epoch holding its
// position keeps the samples before q the set they were, and so does every
// epoch after it already begun (q is one of the positions each was steered
// by; those not begun will be: the resumed trainer's q is present), and q is
// where a loader batch begins.
JoinPlan::ResumePoint JoinPlan::resume_framed(int64_t epoch, int64_t position, int64_t joined_at) const {
  const int64_t whole = options_.samples_per_epoch;
  const int64_t q = joined_at;
  ResumePoint r;
  int64_t e = epoch;
  r.position = position;
  if (whole > 0 && r.position >= whole) {
    e += 1;  // saved after its epoch's last sample: the next one
    r.position = 0;
  }
  r.at_epoch = e;
  r.at_position = q + r.position;
  if (whole > 0 && r.at_position >= whole) {
    r.at_epoch += 1;
    r.at_position -= whole;
  }
  if (q <= 0) throw std::logic_error("join plan: resume_framed() is for epochs begun mid-epoch (joined_at > 0)");
  const int64_t per_batch = loader_batch_samples_;
  const bool batch_boundary = per_batch > 0 && q < whole && q % per_batch == 0;
  // Its epochs from e on run into the producer's after e: each of those
  // steered already must have kept the samples before q (the later ones
  // will: it takes part again).
  bool order_kept = true;
  for (int64_t x = e + 1; x <= steered_epoch_ && order_kept; ++x) {
    const auto steered = steered_by_epoch_.find(x);
    order_kept = steered != steered_by_epoch_.end() &&
                 std::binary_search(steered->second.begin(), steered->second.end(), q);
  }
  r.possible = options_.join_now && whole > 0 && batch_boundary && order_kept;
  const int64_t last = options_.epochs >= 0 ? options_.epochs - 2 : std::numeric_limits<int64_t>::max();
  r.frame = r.possible ? Frame{e, q, q / per_batch, last} : next_epoch_frame();
  return r;
}

// ---- the trainers present and the order ----------------------------------------

void JoinPlan::joined(uint64_t member, const Frame& frame) {
  if (frame.joined_at < 0 || (frame.joined_at > 0 && !options_.join_now)) {
    throw std::logic_error("join plan: a trainer joined at sample " + std::to_string(frame.joined_at) +
                           " of a producer that cannot start trainers mid-epoch");
  }
  if (frame.joined_at > 0) joined_at_[member] = frame.joined_at;
}

void JoinPlan::left(uint64_t member) { joined_at_.erase(member); }

std::vector<int64_t> JoinPlan::steer(int64_t epoch) {
  if (epoch < steered_epoch_) {
    throw std::logic_error("join plan: epoch " + std::to_string(epoch) + " steered after epoch " +
                           std::to_string(steered_epoch_));
  }
  std::set<int64_t> at;
  for (const auto& [member, offset] : joined_at_) at.insert(offset);
  steered_.assign(at.begin(), at.end());
  steered_epoch_ = epoch;
  steered_by_epoch_[epoch] = steered_;
  while (steered_by_epoch_.size() > 2) steered_by_epoch_.erase(steered_by_epoch_.begin());
  return steered_;
}

std::vector<int64_t> JoinPlan::order(std::vector<int64_t> fresh) {
  const int64_t n = static_cast<int64_t>(fresh.size());
  std::vector<int64_t> cuts;
  for (int64_t p : steered_) {
    if (p > 0 && p < n) cuts.push_back(p);
  }
  if (!cuts.empty() && options_.samples_per_epoch > 0 && options_.samples_per_epoch < n) {
    cuts.push_back(options_.samples_per_epoch);  // what drop_last leaves out stays out
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  if (cuts.empty() || !last_order_) {
    last_order_ = fresh;
    return fresh;
  }
  const std::vector<int64_t>& last = *last_order_;
  auto changed = [&](const std::string& what) {
    return InvalidArgument("the loader's sampler changed what an epoch holds (" + what +
                           "): the consumers that joined mid-epoch cannot get every sample of their epochs "
                           "exactly once. Keep the dataset and the sampler as they are while the producer serves");
  };
  if (n != static_cast<int64_t>(last.size())) {
    throw changed("this epoch has " + std::to_string(n) + " samples, the last had " + std::to_string(last.size()));
  }
  // The k-th occurrence of a sample in `fresh` takes the block of its k-th
  // occurrence in `last`: both sorted by (sample, position), then zipped.
  auto by_sample = [](const std::vector<int64_t>& v) {
    std::vector<int64_t> at(v.size());
    std::iota(at.begin(), at.end(), 0);
    std::stable_sort(at.begin(), at.end(), [&](int64_t a, int64_t b) { return v[a] < v[b]; });
    return at;
  };
  const std::vector<int64_t> in_last = by_sample(last);
  const std::vector<int64_t> in_fresh = by_sample(fresh);
  std::vector<int64_t> block(n);
  for (int64_t k = 0; k < n; ++k) {
    if (last[in_last[k]] != fresh[in_fresh[k]]) {
      throw changed("sample " + std::to_string(std::min(last[in_last[k]], fresh[in_fresh[k]])) +
                    " is in one of this epoch and the last more often than in the other");
    }
    block[in_fresh[k]] = std::upper_bound(cuts.begin(), cuts.end(), in_last[k]) - cuts.begin();
  }
  // Each block in fresh's order: a stable bucket sort by block.
  std::vector<int64_t> start(cuts.size() + 2, 0);
  for (int64_t b : block) start[b + 1] += 1;
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[start[block[i]]++] = fresh[i];
  last_order_ = order;
  return order;
}

// ---- one trainer's view ----------------------------------------------------------

Framed JoinPlan::frame(const Frame& f, int64_t epoch, int64_t index, int64_t position, int64_t samples) const {
  Framed r;
  const bool before = position < f.joined_at;  // the end of an epoch of its own
  r.epoch = before ? epoch - 1 : epoch;
  if (r.epoch < f.first_epoch || r.epoch > f.last_epoch) return r;
  r.in_epochs = true;
  r.position = position;
  r.index = index;
  if (f.joined_at > 0) {
    r.position = before ? position + options_.samples_per_epoch - f.joined_at : position - f.joined_at;
    r.index = before ? index + options_.batches_per_epoch - f.joined_at_index : index - f.joined_at_index;
  }
  if (!before || position + samples < f.joined_at) return r;
  if (position + samples > f.joined_at) {
    r.broken = "loader batch " + std::to_string(index) + " of the producer's epoch " + std::to_string(epoch) +
               " spans sample " + std::to_string(f.joined_at) +
               ", where this consumer's epochs begin (the loader's batches moved: did its batch size change?)";
    return r;
  }
  r.ends_epoch = true;
  r.last = r.epoch >= f.last_epoch;
  return r;
}

int64_t JoinPlan::own_epoch(const Frame& f) const {
  if (epoch_ < 0) return f.joined_at > 0 ? next_epoch_ - 1 : next_epoch_;
  return samples_ < f.joined_at ? epoch_ - 1 : epoch_;
}

}  // namespace batchcast
