// What the producers of this user on this machine are doing, asked through
// the protocol (a StatusRequest each), never read from files that can go
// stale. A name whose producer is gone is reported and its leftovers removed.
//
// A producer's status is a JSON object: name, pid, protocol, uptime_seconds,
// epoch, epochs_done, slots, samples_per_epoch, batches_per_epoch,
// batches_published, samples_published, bytes_published, publish_seconds,
// wait_seconds (waiting for consumers), loader_seconds (waiting for the
// loader), ring_bytes, ring_device, slots_in_use, pin_budget, the membership
// counters (joins, leaves, crashes, evictions, refused, dropped_messages),
// and "consumers": each with id, pid, batch_size, first_epoch, batches_sent,
// slots_held, slots_pinned, lag, stall_seconds, leaving.
#pragma once

#include <string>
#include <vector>

namespace batchcast {

struct ProducerListing {
  std::string name;
  std::string endpoint;
  bool alive = false;   // a live producer holds the name
  std::string status;   // its JSON status; empty when it did not answer
  std::string note;     // what happened otherwise
};

// Every producer name in the runtime directory (or only `name`), asked for
// its status within `timeout` seconds each. With `clean`, the lock and socket
// files a dead producer left behind are removed (and reported).
std::vector<ProducerListing> list_producers(const std::string& runtime_dir, const std::string& name,
                                            double timeout, bool clean);

// One producer's status JSON. Throws ProducerLost if it does not answer.
std::string query_status(const std::string& endpoint, double timeout);

}  // namespace batchcast
