// The producer's consumer groups (data-parallel trials), as bookkeeping: the
// ranks of a group each get the whole stream and take their own part of it;
// the group starts when all its ranks are present and ends when one of them
// goes. A restarted group is a new generation of its name, formed beside the
// old until that one breaks. What follows (GroupReady, GroupBroken) the
// membership sends.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "batchcast/protocol/message.h"

namespace batchcast {

class ConsumerGroups {
 public:
  struct Group {
    std::string name;
    int32_t world_size = 0;
    int64_t batch_size = 0;
    std::map<int32_t, std::string> ranks;  // rank -> peer
    bool complete = false;                 // every rank came: it takes part
  };

  explicit ConsumerGroups(std::string producer) : producer_(std::move(producer)) {}

  // Rank `hello.rank` at `peer` joins the forming group of its name (a new
  // one if there is none): its id; 0 when refused, with what to tell the
  // rank in `refused`. `pid_of(peer)`: a member's process, for the message.
  uint64_t admit(const std::string& peer, const protocol::Hello& hello,
                 const std::function<int64_t(const std::string&)>& pid_of, std::string& refused);
  // Every rank of group `id` is present (and it is not complete yet).
  bool all_present(uint64_t id) const;
  Group& at(uint64_t id) { return groups_.at(id); }
  // Rank `rank` of group `id` went. A forming group only loses that rank; a
  // complete one is over: it is returned (and forgotten), its other ranks
  // to be told. None for a forming or already broken group.
  std::optional<Group> rank_went(uint64_t id, int32_t rank);

 private:
  std::string producer_;
  std::map<uint64_t, Group> groups_;  // forming or complete; a broken group leaves
  uint64_t next_ = 1;
};

}  // namespace batchcast
