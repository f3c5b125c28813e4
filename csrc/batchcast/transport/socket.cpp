#include "batchcast/transport/socket.h"

#include <poll.h>

#include <cerrno>

#include "batchcast/common/error.h"

namespace batchcast::transport {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const char* call) {
  const int err = zmq_errno();
  throw SystemError(std::string("ZeroMQ ") + call + " failed (" + zmq_strerror(err) + ")", err);
}

long remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<long>(left);
}

}  // namespace

int poll(zmq::pollitem_t* items, int count, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (true) {
    int n = zmq_poll(items, count, remaining_ms(deadline));
    if (n >= 0) return n;
    if (zmq_errno() != EINTR) fail("poll");
  }
}

void wait_readable(std::initializer_list<int> fds, std::chrono::milliseconds timeout) {
  pollfd items[4];
  nfds_t n = 0;
  for (int fd : fds) {
    if (n < 4 && fd >= 0) items[n++] = pollfd{fd, POLLIN, 0};
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  while (::poll(items, n, static_cast<int>(remaining_ms(deadline))) < 0) {
    if (errno != EINTR) throw SystemError("poll", errno);
  }
}

bool try_receive(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  frames.clear();
  while (true) {
    zmq::message_t frame;
    int rc = zmq_msg_recv(frame.handle(), socket.handle(), ZMQ_DONTWAIT);
    if (rc < 0) {
      const int err = zmq_errno();
      if (err == EINTR) continue;
      // Frames of one message arrive together: EAGAIN can only come first.
      if (err == EAGAIN && frames.empty()) return false;
      fail("receive");
    }
    const bool more = frame.more();
    frames.push_back(std::move(frame));
    if (!more) return true;
  }
}

bool try_send(zmq::socket_t& socket, std::initializer_list<std::string_view> frames) {
  std::size_t k = 0;
  for (std::string_view frame : frames) {
    const int flags = ZMQ_DONTWAIT | (++k < frames.size() ? ZMQ_SNDMORE : 0);
    while (zmq_send(socket.handle(), frame.data(), frame.size(), flags) < 0) {
      const int err = zmq_errno();
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EHOSTUNREACH) return false;
      fail("send");
    }
  }
  return true;
}

bool readable(zmq::socket_t& socket) {
  int events = 0;
  std::size_t size = sizeof(events);
  while (zmq_getsockopt(socket.handle(), ZMQ_EVENTS, &events, &size) != 0) {
    if (zmq_errno() != EINTR) fail("getsockopt(ZMQ_EVENTS)");
  }
  return (events & ZMQ_POLLIN) != 0;
}

}  // namespace batchcast::transport
