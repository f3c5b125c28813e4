// Exceptions a batchcast user can cause or observe. Each says what happened and
// what to do; internal invariants use assert instead.
#pragma once

#include <stdexcept>
#include <string>

namespace batchcast {

// Base of every batchcast error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad arguments: names, sizes, options.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Another live producer already serves this name.
class NameInUse : public Error {
 public:
  using Error::Error;
};

// The producer died, stopped mid-epoch, or never came up within the timeout.
class ProducerLost : public Error {
 public:
  using Error::Error;
};

// The producer evicted this consumer: it held the oldest batch longer than the
// producer's straggler_timeout while the producer waited for ring space.
class Evicted : public Error {
 public:
  using Error::Error;
};

// The user's loader raised inside the producer; carries its message.
class LoaderError : public Error {
 public:
  using Error::Error;
};

// A rank of this consumer's group left, died or was evicted: the group's
// epoch cannot go on (its ranks would wait for each other forever).
class GroupError : public Error {
 public:
  using Error::Error;
};

// The two ends speak different protocol versions, or the producer refused us.
class Refused : public Error {
 public:
  using Error::Error;
};

// Loader batches that cannot be rebatched together (trailing shapes, dtypes).
class RebatchError : public Error {
 public:
  using Error::Error;
};

// A consumer asked for an epoch after the producer had served every epoch it
// was asked to serve (and it was not told to hand out empty epochs then).
class EpochsExhausted : public Error {
 public:
  using Error::Error;
};

// A consumer with a stall limit (stall_timeout) waited that long for its next
// batch with nothing from the producer meanwhile: its loader hangs or is that
// slow, or the producer waits for something (consumers, ring space).
class Stalled : public Error {
 public:
  using Error::Error;
};

// The producer was asked to stop while a call was blocked.
class Stopped : public Error {
 public:
  using Error::Error;
};

// A CUDA call failed, the producer's GPU is not visible here, or this build
// has no CUDA transport; the message says which and what to do.
class CudaError : public Error {
 public:
  using Error::Error;
};

// A message that failed validation. Never escapes the I/O threads: such
// messages are dropped and counted.
class MalformedMessage : public Error {
 public:
  using Error::Error;
};

// An operating-system call failed; the message names the call and errno text.
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int err);
  int code() const { return code_; }

 private:
  int code_;
};

}  // namespace batchcast
