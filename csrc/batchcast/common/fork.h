// Objects of the core across fork(). The child of a fork has a copy of every
// object of the core, but none of their threads, and their sockets, shared
// memory, files and locks are the parent's: a ZeroMQ context whose I/O
// threads are gone, a mutex or condition variable another thread held or
// waited on when the parent forked, a socket file the parent still serves on,
// ring slots the parent still uses. Destroying such a copy would join threads
// that do not exist (std::terminate), wait for ever on a lock or a condition
// variable's waiters, close the parent's connection or give its slots back.
//
// So an object remembers where it was made (Birthplace); in a child of a fork
// its owner leaves it and what it owns as they are (`leave_behind`: moved
// where nothing destroys it; the child's exit frees the memory), and a
// release of a slot made there is the parent's business, not the child's.
#pragma once

#include <cstdint>
#include <utility>

namespace batchcast {

// A number that changes in every child of a fork (pthread_atfork): cheaper
// than getpid() on every slot release, and never the parent's again.
uint64_t process_generation() noexcept;

class Birthplace {
 public:
  // Whether this is the process the object was made in (not a forked child).
  bool here() const noexcept { return generation_ == process_generation(); }

 private:
  uint64_t generation_ = process_generation();
};

// Moves `owner` (a std::thread, a ZeroMQ socket or context, a smart pointer,
// a container of them) where nothing ever destroys it; `owner` is left empty,
// so its own destructor does nothing. For a forked child's copies only.
template <typename T>
void leave_behind(T& owner) noexcept {
  new T(std::move(owner));  // never deleted, on purpose
}

}  // namespace batchcast
