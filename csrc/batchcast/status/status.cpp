#include "batchcast/status/status.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <set>

#include <zmq.hpp>

#include "batchcast/common/endpoint.h"
#include "batchcast/common/error.h"
#include "batchcast/common/fd.h"
#include "batchcast/protocol/message.h"
#include "batchcast/transport/socket.h"

namespace batchcast {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether a live process holds the name's lock. If none does and `clean`,
// removes the lock and socket files while holding the lock itself (a producer
// starting meanwhile notices the file it locked is gone and takes a new one).
bool held(const std::string& dir, const std::string& name, bool clean, bool& removed) {
  removed = false;
  const std::string lock_path = dir + "/" + name + ".lock";
  const std::string socket_path = dir + "/" + name + ".sock";
  Fd fd(::open(lock_path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {  // a socket without its lock: nobody can be serving it
    if (clean && ::unlink(socket_path.c_str()) == 0) removed = true;
    return false;
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return errno == EWOULDBLOCK;
  if (clean) {
    ::unlink(socket_path.c_str());
    removed = ::unlink(lock_path.c_str()) == 0;
  }
  return false;
}

}  // namespace

std::string query_status(const std::string& endpoint, double timeout) {
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  transport::try_send(dealer, {protocol::encode(protocol::StatusRequest{})});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<
      std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout));
  zmq::pollitem_t items[] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}};
  std::vector<zmq::message_t> frames;
  while (std::chrono::steady_clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    transport::poll(items, 1, std::max(left, std::chrono::milliseconds(1)));
    while (transport::try_receive(dealer, frames)) {
      if (frames.size() != 1) continue;
      try {
        protocol::Message m = protocol::decode(frames[0].data(), frames[0].size());
        if (auto* s = std::get_if<protocol::Status>(&m)) return s->json;
        if (auto* r = std::get_if<protocol::Refuse>(&m)) throw Refused(r->reason);
      } catch (const MalformedMessage&) {
      }
    }
  }
  throw ProducerLost("the producer at " + endpoint + " did not answer a status request within " +
                     std::to_string(timeout) + " s");
}

std::vector<ProducerListing> list_producers(const std::string& runtime_dir_override, const std::string& name,
                                            double timeout, bool clean) {
  const std::string dir = runtime_dir(runtime_dir_override);
  std::set<std::string> names;
  if (!name.empty()) {
    validate_name(name);
    names.insert(name);
  } else if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string file = e->d_name;
      for (const char* tail : {".lock", ".sock"}) {
        if (ends_with(file, tail)) names.insert(file.substr(0, file.size() - 5));
      }
    }
    ::closedir(d);
  }
  std::vector<ProducerListing> out;
  for (const std::string& n : names) {
    ProducerListing p;
    p.name = n;
    try {
      p.endpoint = endpoint_for(dir, n);
    } catch (const InvalidArgument& e) {
      continue;  // not a name batchcast would have made
    }
    bool removed = false;
    p.alive = held(dir, n, clean, removed);
    if (!p.alive) {
      if (removed) {
        p.note = "left behind by a producer that is gone; removed";
      } else if (!name.empty()) {
        p.note = "no producer named '" + n + "' is running";
      } else {
        p.note = "left behind by a producer that is gone";
      }
      out.push_back(std::move(p));
      continue;
    }
    try {
      p.status = query_status(p.endpoint, timeout);
    } catch (const Error& e) {
      p.note = e.what();
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace batchcast
