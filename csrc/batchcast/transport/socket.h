// ZeroMQ calls as batchcast uses them: non-blocking sends and receives, and
// waits that a signal never turns into an error. cppzmq throws on EINTR; here
// every call retries it (with the time that is left), so that no signal can
// abort a producer or a consumer.
#pragma once

#include <chrono>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

namespace batchcast::transport {

// Waits up to `timeout` until an item is ready; returns how many are.
int poll(zmq::pollitem_t* items, int count, std::chrono::milliseconds timeout);

// Waits up to `timeout` until one of the file descriptors is readable (plain
// poll(2), for waiting on a socket's ZMQ_FD without touching the socket).
void wait_readable(std::initializer_list<int> fds, std::chrono::milliseconds timeout);

// Receives one whole message (all its frames) if one is queued; false if none.
bool try_receive(zmq::socket_t& socket, std::vector<zmq::message_t>& frames);

// Sends the frames as one message without blocking; false if the peer is gone
// (ROUTER: EHOSTUNREACH) or cannot take it now.
bool try_send(zmq::socket_t& socket, std::initializer_list<std::string_view> frames);

// Whether a message can be received now (ZMQ_EVENTS). Also what keeps the
// socket's ZMQ_FD honest after a send: call it before waiting on that fd.
bool readable(zmq::socket_t& socket);

}  // namespace batchcast::transport
