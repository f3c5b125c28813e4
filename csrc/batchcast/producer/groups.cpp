#include "batchcast/producer/groups.h"

#include <algorithm>

namespace batchcast {

uint64_t ConsumerGroups::admit(const std::string& peer, const protocol::Hello& hello,
                               const std::function<int64_t(const std::string&)>& pid_of, std::string& refused) {
  auto it = std::find_if(groups_.begin(), groups_.end(),
                         [&](const auto& g) { return !g.second.complete && g.second.name == hello.group; });
  std::string why;
  if (it != groups_.end()) {
    const Group& g = it->second;
    if (g.world_size != hello.world_size) {
      why = "its world_size is " + std::to_string(hello.world_size) + " but rank(s) already there said " +
            std::to_string(g.world_size);
    } else if (g.batch_size != hello.batch_size) {
      why = "its batch_size is " + std::to_string(hello.batch_size) + " but rank(s) already there said " +
            std::to_string(g.batch_size);
    } else if (g.ranks.count(hello.rank) != 0) {
      why = "rank " + std::to_string(hello.rank) + " is already there (consumer pid " +
            std::to_string(pid_of(g.ranks.at(hello.rank))) + ")";
    }
  }
  if (!why.empty()) {
    refused = "producer '" + producer_ + "' refused rank " + std::to_string(hello.rank) + " of consumer group '" +
              hello.group + "': " + why +
              "; every rank of a group needs the same world_size and batch_size, and a rank of its own";
    return 0;
  }
  if (it == groups_.end()) {
    it = groups_.emplace(next_++, Group{hello.group, hello.world_size, hello.batch_size, {}, false}).first;
  }
  it->second.ranks[hello.rank] = peer;
  return it->first;
}

bool ConsumerGroups::all_present(uint64_t id) const {
  const Group& g = groups_.at(id);
  return !g.complete && g.ranks.size() == static_cast<std::size_t>(g.world_size);
}

std::optional<ConsumerGroups::Group> ConsumerGroups::rank_went(uint64_t id, int32_t rank) {
  auto g = groups_.find(id);
  if (g == groups_.end()) return std::nullopt;  // broken already
  if (!g->second.complete) {
    g->second.ranks.erase(rank);
    if (g->second.ranks.empty()) groups_.erase(g);
    return std::nullopt;
  }
  Group broken = std::move(g->second);
  groups_.erase(g);
  return broken;
}

}  // namespace batchcast
