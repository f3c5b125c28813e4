// What the producer tells about itself: stats() (for the caller and
// `batchcast status`), the same as JSON for a consumer's StatusRequest, the
// consumers present and the loader's workers it was told of.
#include "batchcast/producer/producer.h"

#include "batchcast/common/json.h"
#include "batchcast/producer/internal.h"

namespace batchcast {

void Producer::note_loader_workers(std::vector<int64_t> pids) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.loader_workers = std::move(pids);
}

int64_t Producer::consumer_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return membership_.active();
}

ProducerStats Producer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ProducerStats s = stats_;
  s.uptime_seconds = seconds_since(started_);
  if (waiting_for_space_) {
    s.waiting_for = "consumers";
    s.waiting_seconds = seconds_since(waiting_since_);
  } else if (membership_.awaiting() > 0) {
    s.waiting_for = "joins";
    s.consumers_wanted = membership_.awaiting();
  } else if (last_publish_end_) {
    s.waiting_for = "loader";
    s.waiting_seconds = seconds_since(*last_publish_end_);
  }
  s.epoch = epoch_;
  s.epochs_done = epochs_done_;
  s.epoch_batches = epoch_batches_;
  s.batches_per_epoch = options_.batches_per_epoch >= 0 ? options_.batches_per_epoch : first_epoch_batches_;
  const MembershipCounters& c = membership_.counters();
#define BATCHCAST_COPY_COUNTER(type, name, init) s.name = c.name;
  BATCHCAST_MEMBERSHIP_COUNTERS(BATCHCAST_COPY_COUNTER)
#undef BATCHCAST_COPY_COUNTER
  s.messages_over_socket = over_socket_.load();
  s.leases_out = slots_.count(SlotLedger::State::Leased);
  if (ring_) {
    s.slots_in_use = ring_->slots_in_use();
    s.direct_copies = ring_->direct_copies();
  }
  s.pin_budget = membership_.pin_budget();
  s.stuck = membership_.stuck();
  s.consumers = membership_.consumers();
  return s;
}

std::string Producer::status_json() const {
  const ProducerStats s = stats();
  JsonWriter w;
  w.begin_object();
  w.field("protocol", static_cast<int>(protocol::kVersion));
  w.field("slots", options_.slots);
  w.field("samples_per_epoch", options_.samples_per_epoch);
  s.visit([&](const char* name, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      w.key(name).begin_array();
      for (int64_t v : value) w.value(v);
      w.end_array();
    } else if constexpr (std::is_same_v<T, std::vector<ConsumerInfo>>) {
      w.key(name).begin_array();
      for (const ConsumerInfo& c : value) {
        w.begin_object();
        c.visit([&](const char* k, const auto& v) { w.field(k, v); });
        w.end_object();
      }
      w.end_array();
    } else {
      w.field(name, value);
    }
  });
  w.end_object();
  return w.str();
}

}  // namespace batchcast
