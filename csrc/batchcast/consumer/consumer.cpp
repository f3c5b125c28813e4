// The consumer's life: joining, its epochs (begun, read, left, restarted
// after a peek), its group, where it resumes, and its stats. How batches get
// where it wants them (views, copies, private copies) is in transfer.cpp.
#include "batchcast/consumer/consumer.h"

#include <algorithm>
#include <cstdio>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/error.h"
#include "batchcast/consumer/channel.h"
#include "batchcast/cuda/transport.h"

namespace batchcast {

namespace {

ConsumerOptions checked(ConsumerOptions o) {
  validate_name(o.name);
  if (!(o.timeout > 0)) throw InvalidArgument("timeout must be positive (seconds)");
  if (o.world_size < 0 || o.world_size > protocol::kMaxWorldSize) {
    throw InvalidArgument("world_size must be between 1 and " + std::to_string(protocol::kMaxWorldSize));
  }
  if (o.world_size > 0) {
    if (o.group.empty() || o.group.size() > protocol::kMaxGroupName) {
      throw InvalidArgument("a consumer group needs a name of 1-" + std::to_string(protocol::kMaxGroupName) +
                            " characters");
    }
    if (o.rank < 0 || o.rank >= o.world_size) {
      throw InvalidArgument("rank " + std::to_string(o.rank) + " is not in [0, world_size=" +
                            std::to_string(o.world_size) + ")");
    }
    if (!o.batch_size) throw InvalidArgument("a consumer group needs a batch_size (each rank's)");
  } else if (!o.group.empty() || o.rank != 0) {
    throw InvalidArgument("group and rank need world_size");
  }
  if (o.writable && o.shared_gpu_views) {
    throw InvalidArgument("writable=True and shared_gpu_views=True ask for opposite things: batches you may "
                          "modify (private copies), and views of GPU memory every consumer shares; pass one");
  }
  if ((o.pad_every || !o.pad_leaves.empty()) && !o.batch_size) {
    throw InvalidArgument("padding re-pads samples that one batch joins from several loader batches: it needs "
                          "a batch_size");
  }
  if (!(o.stall_timeout >= 0) || o.stall_timeout > 1e9) {
    throw InvalidArgument("stall_timeout must be seconds >= 0 (0: wait for ever)");
  }
  if (o.resume_epoch < -1 || o.resume_position < 0 || o.resume_joined_at < 0) {
    throw InvalidArgument("resume_epoch must be >= 0 (or -1: no resume), resume_position and resume_joined_at >= 0");
  }
  return o;
}

LoaderError loader_error(const std::string& name, const protocol::LoaderFailed& failed) {
  if (failed.cause == protocol::LoaderFailed::Cause::CannotShare) {
    return LoaderError("batchcast producer '" + name + "' cannot serve what its loader yielded in epoch " +
                       std::to_string(failed.epoch) + ": " + failed.message);
  }
  return LoaderError("the loader of batchcast producer '" + name + "' raised: " + failed.message);
}

std::optional<GroupRank> group_of(const ConsumerOptions& o) {
  if (o.world_size == 0) return std::nullopt;
  return GroupRank{o.rank, o.world_size};
}

}  // namespace

Consumer::Consumer(ConsumerOptions options)
    : options_(checked(std::move(options))),
      rebatcher_(options_.batch_size, options_.drop_last, group_of(options_)) {
  rebatcher_.set_padding(Padding{options_.pad_leaves, options_.pad_every, options_.pad_multiple_of});
  const std::string endpoint = endpoint_for(runtime_dir(options_.runtime_dir), options_.name);
  ChannelOptions channel;
  channel.name = options_.name;
  channel.endpoint = endpoint;
  channel.catch_up = options_.catch_up;
  channel.join_now = options_.join_now;
  channel.batch_size = options_.batch_size.value_or(0);
  channel.group = options_.group;
  channel.rank = options_.rank;
  channel.world_size = options_.world_size;
  channel.resume_epoch = options_.resume_epoch;
  channel.resume_position = options_.resume_position;
  channel.resume_joined_at = options_.resume_joined_at;
  channel.resume_run = options_.resume_run;
  channel.release_after = options_.release_after;
  channel.interrupt = options_.interrupt;
  channel_ = Channel::connect(std::move(channel));
  try {
    protocol::Welcome w = channel_->join(options_.timeout);
    joined_ = w;
    joined_.ring = {};
    loader_ = w.loader;
    life_ = Lifecycle(/*grouping=*/w.first_epoch < 0);
    if (!life_.grouping()) {
      next_epoch_ = first_epoch_ = w.first_epoch;
      joined_at_ = w.joined_at;
      resume_from(w.resume, w.first_epoch, w.resume_position);
    } else {
      joined_at_ = options_.resume_joined_at;  // until GroupReady says where the group starts
    }
    // The ring has room for slots+1 loader batches in flight; holding at most
    // this many pending (plus the batch the caller holds) always leaves the
    // producer one.
    rebatcher_.set_max_pending(std::max<int64_t>(0, (w.slots - 2) / 2));
    samples_per_epoch_ = w.samples_per_epoch;
    loader_batches_per_epoch_ = w.batches_per_epoch;
    pin_budget_ = w.pin_budget;
    id_ = w.consumer_id;
    place(w.ring);
    // Views of the ring are shared with every other consumer: a GPU view is
    // writable (CUDA IPC maps it so), so by default a GPU batch is copied.
    copy_out_ = options_.writable || (transfer_ == Transfer::View && !options_.shared_gpu_views);
  } catch (...) {
    channel_->leave();
    throw;
  }
}

Consumer::~Consumer() {
  if (!born_.here()) {  // a forked child's copy: the connection is the parent's (common/fork.h)
    leave_behind(channel_);
    return;
  }
  close();
  channel_.reset();  // the channel itself lives on while handed-out tensors do
}

void Consumer::close() {
  if (!born_.here()) return;  // a forked child's copy: the connection is the parent's
  rebatcher_.clear();
  replay_.clear();
  replaying_ = false;
  if (channel_) channel_->leave();
  life_.close();
}

int64_t Consumer::samples_per_epoch() const { return samples_per_epoch_; }

int64_t Consumer::own_samples_per_epoch() const { return rebatcher_.samples_for(samples_per_epoch_); }

int64_t Consumer::batches_per_epoch() const {
  if (!options_.batch_size) return loader_batches_per_epoch_;
  return rebatcher_.batches_for(samples_per_epoch_);
}

std::pair<int64_t, int64_t> Consumer::position() const {
  if (life_.in_epoch()) {
    const int64_t at = rebatcher_.position();
    // Everything of the epoch taken (its end not read yet): the next epoch.
    if (samples_per_epoch_ >= 0 && at >= samples_per_epoch_) return {epoch_ + 1, 0};
    return {epoch_, at};
  }
  if (life_.grouping()) {
    return {options_.resume_epoch, options_.resume_epoch >= 0 ? options_.resume_position : 0};
  }
  if (next_epoch_ == resume_at_epoch_) return {resume_at_epoch_, resume_position_};
  return {next_epoch_, 0};
}

// Where the producer says this consumer (or its group) resumes.
void Consumer::resume_from(protocol::Resume resume, int64_t first_epoch, int64_t position) {
  resume_ = resume;
  if (resume == protocol::Resume::None) return;
  resume_at_epoch_ = first_epoch;
  resume_position_ = position;
  if (resume == protocol::Resume::NextPass && options_.reporter) {
    const bool restarted = options_.resume_run != joined_.run;
    options_.reporter(Report{
        Report::Level::Warning, "Resume",
        "consumer of '" + options_.name + "' resumes epoch " + std::to_string(options_.resume_epoch) +
            " at sample " + std::to_string(options_.resume_position) +
            (restarted ? ", saved while another run of the producer served (it was restarted since, so "
                         "that epoch's order is gone)"
                       : ", which the producer no longer holds (it keeps only what consumers still use and the "
                         "first batches of each epoch)") +
            ": the samples it had not taken of that epoch are lost to it, "
            "and it gets stream positions from " + std::to_string(position) + " of epoch " +
            std::to_string(first_epoch) + " (the loader's next pass) in their place, then whole epochs"});
  }
}

// A group's rank waits here, in its first iter(), for the rest of its group.
void Consumer::await_group() {
  namespace pr = protocol;
  while (life_.grouping()) {
    StreamMessage m = channel_->take();
    std::visit(pr::Exhaustive{
                   [&](pr::GroupReady& ready) {
                     life_.group_ready();
                     next_epoch_ = first_epoch_ = ready.first_epoch;
                     joined_at_ = ready.joined_at;
                     resume_from(ready.resume, ready.first_epoch, ready.resume_position);
                   },
                   [&](pr::LoaderFailed& failed) {
                     life_.loader_failed(failed);
                     throw loader_error(options_.name, failed);
                   },
                   [&](pr::Finished& end) { life_.stream_ended(/*started=*/false, end); },
                   // Never sent before GroupReady: not ours.
                   [&](pr::Announcement& a) { channel_->release_now(a.seq); },
                   [&](pr::EpochEnd&) {},
                   [&](pr::GroupBroken&) {},  // a forming group does not break (it waits for a new rank)
               },
               m);
  }
}

void Consumer::fail_group(const protocol::GroupBroken& broken) {
  auto error = std::make_exception_ptr(GroupError(broken.reason));
  life_.broke(error);
  rebatcher_.clear();
  channel_->leave();
  std::rethrow_exception(error);
}

// A peek: the consumer's first epoch has handed out one batch (or none) and
// still holds every loader batch of it so far.
bool Consumer::can_restart() const { return life_.in_epoch() && replaying_ && epoch_batches_ <= 1; }

int64_t Consumer::begin_epoch() {
  if (const auto* broken = std::get_if<Lifecycle::Broken>(&life_.state())) std::rethrow_exception(broken->error);
  // An iterator of an epoch that has handed out nothing yet just goes on.
  if (life_.in_epoch() && epoch_batches_ == 0) return epoch_;
  if (can_restart()) {
    std::vector<LoaderBatch> replay = std::move(replay_);
    replay_.clear();
    replaying_ = false;
    rebatcher_.set_joined_at(joined_at_);
    rebatcher_.begin_epoch(samples_per_epoch_, epoch_ == resume_at_epoch_ ? resume_position_ : 0);
    epoch_batches_ = 0;
    for (LoaderBatch& b : replay) rebatcher_.push(std::move(b));
    if (options_.reporter) {
      options_.reporter(Report{Report::Level::Info, {},
                               "consumer of '" + options_.name + "': its first iterator was left after one batch "
                               "(a peek such as next(iter(loader))), so epoch " + std::to_string(epoch_) +
                               " starts again from its start, that batch included"});
    }
    return epoch_;
  }
  if (life_.in_epoch()) life_.left_early(epoch_, epoch_batches_);
  replay_.clear();
  replaying_ = false;
  while (life_.in_epoch()) {
    (void)next();  // drain what is left of an epoch the caller left early
  }
  if (life_.grouping()) await_group();
  rebatcher_.clear();
  epoch_ = next_epoch_++;
  epoch_batches_ = 0;
  life_.begin();
  replaying_ = life_.in_epoch() && epoch_ == first_epoch_;
  rebatcher_.set_joined_at(joined_at_);
  rebatcher_.begin_epoch(samples_per_epoch_, epoch_ == resume_at_epoch_ ? resume_position_ : 0);
  if (life_.group_broken() && life_.group_broken()->epoch <= epoch_) fail_group(*life_.group_broken());
  return epoch_;
}

// The current epoch is one the producer never serves: it was stopped first
// (ProducerLost), or it served every epoch it was asked to (EpochsExhausted,
// or an empty epoch where the consumer asked for that).
std::optional<ViewBatch> Consumer::past_end() {
  if (life_.loader_failure()) throw loader_error(options_.name, *life_.loader_failure());  // the stream ended in it
  const protocol::Finished& end = *life_.stream_end();
  const std::string served =
      end.epochs == 0 ? "no epoch"
                      : end.epochs == 1 ? "epoch 0" : "epochs 0 to " + std::to_string(end.epochs - 1);
  std::string mine;
  if (first_epoch_ < 0 || epochs_done_ == 0) {
    mine = "this consumer was handed no epoch whole";
    if (end.epochs > 0 && first_epoch_ >= end.epochs) {
      mine += " (it joined after the last one began: a consumer starts at the next epoch)";
    }
  } else {
    mine = "this consumer started at epoch " + std::to_string(first_epoch_) + " and was handed " +
           std::to_string(epochs_done_) + (epochs_done_ == 1 ? " epoch" : " epochs") + " to its end";
  }
  if (const auto& left = life_.left()) {
    mine += "; its iterator of epoch " + std::to_string(left->epoch) + " was left after " +
            std::to_string(left->batches) + (left->batches == 1 ? " batch" : " batches") +
            ", which used that epoch up";
  }
  const std::string who = "batchcast producer '" + options_.name + "'";
  if (end.stopped) {
    throw ProducerLost(who + " was stopped before it served epoch " + std::to_string(epoch_) +
                       " to this consumer (it served " + served + " in full; " + mine +
                       "). Keep the producer serving until its trainers are done, or have them ask for no "
                       "more epochs than it serves");
  }
  if (options_.empty_past_last_epoch) return std::nullopt;
  throw EpochsExhausted(
      who + " has served every epoch it was asked to (" + served + ") and ended, and this consumer asked for "
      "epoch " + std::to_string(epoch_) + " (" + mine + "). Serve as many epochs as the trainers take "
      "(Producer(..., epochs=None) serves until stopped; batchcast serve --epochs N), or iterate this "
      "consumer fewer times; Consumer(..., join=bc.Join(past_last_epoch='empty')) gives empty epochs "
      "instead of this error");
}

std::optional<Batch> Consumer::next() {
  std::optional<ViewBatch> batch = next_views();
  if (!batch) return std::nullopt;
  return materialize(std::move(*batch));
}

std::optional<ViewBatch> Consumer::next_views(bool identities) {
  // What next() does in each state of the consumer's life (every one handled).
  struct Dispatch {
    Consumer& c;
    bool identities;
    std::optional<ViewBatch> operator()(const Lifecycle::InEpoch&) { return c.take_next(identities); }
    std::optional<ViewBatch> operator()(const Lifecycle::Ended& e) {
      return e.past_end ? c.past_end() : std::nullopt;  // else: its epoch was cut short, and is over
    }
    std::optional<ViewBatch> operator()(const Lifecycle::Broken& b) { std::rethrow_exception(b.error); }
    std::optional<ViewBatch> operator()(const Lifecycle::Between&) { return std::nullopt; }   // the epoch ended
    std::optional<ViewBatch> operator()(const Lifecycle::Grouping&) { return std::nullopt; }  // none begun
    std::optional<ViewBatch> operator()(const Lifecycle::Closed&) { return std::nullopt; }
  };
  return std::visit(Dispatch{*this, identities}, life_.state());
}

// The next batch of the epoch under way, reading what the producer sent.
std::optional<ViewBatch> Consumer::take_next(bool identities) {
  // GPU: torch's device guards inside find the ring's device current, so they
  // switch nothing; the caller's thread is left as it was.
  std::optional<cuda::DeviceScope> scope;
  if (ring_device_ >= 0) scope.emplace(ring_device_);
  namespace pr = protocol;
  // What a message makes of the call: a batch (or the epoch's end: none) to
  // hand out, or nothing yet (read on).
  using Step = std::optional<std::optional<ViewBatch>>;
  auto news = std::chrono::steady_clock::now();  // when the producer last brought this call samples
  while (true) {
    if (auto b = rebatcher_.pop(identities)) {
      if (++epoch_batches_ > 1 && replaying_) {
        replay_.clear();  // no longer a peek
        replaying_ = false;
      }
      return hand_out(std::move(b));
    }
    StreamMessage m = channel_->take([&](double waited) {
      say_what_it_waits_for(waited);
      check_stall(news);
    });
    Step step = std::visit(
        pr::Exhaustive{
            [&](pr::Announcement& a) -> Step {
              if (a.epoch != epoch_) {
                channel_->release_now(a.seq);  // not ours
                return std::nullopt;
              }
              life_.batch_arrived();
              receive(a);
              news = std::chrono::steady_clock::now();
              return std::nullopt;
            },
            [&](pr::EpochEnd& end) -> Step {
              if (end.epoch != epoch_) return std::nullopt;
              samples_per_epoch_ = end.samples;
              loader_batches_per_epoch_ = end.batches;
              life_.epoch_ended();
              epochs_done_ += 1;
              replay_.clear();
              replaying_ = false;
              auto rest = rebatcher_.flush(end.samples, identities);
              if (rest) epoch_batches_ += 1;
              return hand_out(std::move(rest));
            },
            [&](pr::GroupBroken& broken) -> Step {
              if (broken.epoch <= epoch_) fail_group(broken);
              life_.group_breaks(broken);  // it left after this epoch: the next one fails
              return std::nullopt;
            },
            [&](pr::LoaderFailed& failed) -> Step {
              life_.loader_failed(failed);
              rebatcher_.clear();
              replay_.clear();
              throw loader_error(options_.name, failed);
            },
            [&](pr::Finished& end) -> Step {
              const bool started = rebatcher_.buffered() > 0 || life_.arrived();
              life_.stream_ended(started, end);
              rebatcher_.clear();
              replay_.clear();
              if (started) {
                throw ProducerLost("batchcast producer '" + options_.name + "' " +
                                   (end.stopped ? "was stopped" : "ended") + " before the end of epoch " +
                                   std::to_string(epoch_));
              }
              return past_end();
            },
            [&](pr::GroupReady&) -> Step { return std::nullopt; },  // its group formed long ago: not news
        },
        m);
    if (step) return std::move(*step);
  }
}

// A consumer whose first epoch has not begun a second after it asked for it
// says once, at INFO, what it waits for: the producer waiting for more
// consumers (min_consumers), the next epoch (it joined mid-epoch), or the
// first batch (a loader starting up).
void Consumer::say_what_it_waits_for(double waited) {
  if (told_waiting_ || waited < 1.0 || life_.arrived() || epoch_ != first_epoch_ || !options_.reporter) return;
  told_waiting_ = true;
  const std::string who = "consumer of '" + options_.name + "'";
  std::string text;
  if (joined_.consumers_wanted > joined_.consumers_present) {
    text = who + " waits for the producer to begin: it waits for " + std::to_string(joined_.consumers_wanted) +
           " consumers before it loads anything (min_consumers), and " + std::to_string(joined_.consumers_present) +
           (joined_.consumers_present == 1 ? " was" : " were") + " present when this one joined";
  } else if (joined_.producer_epoch >= 0 && epoch_ > joined_.producer_epoch) {
    text = who + " waits for epoch " + std::to_string(epoch_) + " to begin: it joined while the producer served epoch " +
           std::to_string(joined_.producer_epoch) + ", and a consumer joining mid-epoch starts at the next one" +
           (options_.catch_up ? " (that epoch's first batches were no longer retained to catch up on)"
                              : " (join='catch_up' takes the current epoch while its first batches are retained)");
  } else {
    text = who + " waits for the first batch of epoch " + std::to_string(epoch_) +
           " (the producer's loader is starting, or slow; `batchcast status " + options_.name + "` shows it)";
  }
  options_.reporter(Report{Report::Level::Info, {}, text});
}

void Consumer::check_stall(std::chrono::steady_clock::time_point since) const {
  if (options_.stall_timeout <= 0) return;
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  if (waited < options_.stall_timeout) return;
  char text[64];
  std::snprintf(text, sizeof text, "%.1f s (stall_timeout=%g)", waited, options_.stall_timeout);
  throw Stalled("consumer of '" + options_.name + "' waited " + text + " for its next batch of epoch " +
                std::to_string(epoch_) + " (" + std::to_string(epoch_batches_) + " of its batches handed out)" +
                " and the producer brought it no sample in that time");
}

// While the first epoch is peekable, its loader batches are kept (sharing
// their slots' tokens), as many as the rebatcher itself may hold: beyond
// that the producer could wait on them, so a peek can no longer restart.
void Consumer::push(LoaderBatch batch) {
  if (replaying_) {
    replay_.push_back(batch);
    int64_t in_ring = 0;
    for (const LoaderBatch& b : replay_) in_ring += b.spilled() ? 0 : 1;
    if (in_ring > rebatcher_.max_pending()) {
      replay_.clear();
      replaying_ = false;
    }
  }
  rebatcher_.push(std::move(batch));
}

ConsumerStats Consumer::stats() const {
  ConsumerStats s;
  const ChannelStats c = channel_->stats();
  s.id = id_;
  s.epoch = epoch_;
  s.joined_at = joined_at_;
  s.batches = batches_;
  s.samples = samples_;
  s.sample_identity = !indexed_ ? "" : *indexed_ ? "dataset index" : "position";
  s.loader_batches = c.received;
  s.views = rebatcher_.stats().views;
  s.copies = rebatcher_.stats().copies;
  s.spills = rebatcher_.stats().spills;
  s.repadded = rebatcher_.stats().repadded;
  s.private_copies = private_copies_;
  s.batch_copies = batch_copies_;
  s.slots_held = c.slots_held;
  s.slots_pinned = std::max<int64_t>(0, pinned_beyond(0));
  s.pin_budget = pin_budget_;
  s.dropped_messages = c.dropped_messages;
  s.mailbox = c.mailbox;
  s.device = device_text(device_);
  s.ring_device = ring_device_;
  static constexpr const char* kTransfers[] = {"shared-memory", "view", "peer", "host-staged",
                                               "device-to-host"};
  s.transfer = kTransfers[static_cast<int>(transfer_)];
  s.ipc_memory_opens = c.ipc_memory_opens;
  s.ipc_event_opens = c.ipc_event_opens;
  s.transfers = transfers_;
  s.ring_address = c.ring_address;
  s.ring_bytes = c.ring_bytes;
  s.loader = loader_;
  s.run = joined_.run;
  s.resumed = resume_ == protocol::Resume::Exact      ? "exact"
              : resume_ == protocol::Resume::NextPass ? "next-pass"
                                                      : "";
  return s;
}

}  // namespace batchcast
