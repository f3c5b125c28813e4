// The wire format between a producer and its consumers: an 8-byte header
// (magic, version, kind) and a typed little-endian body. Decoding validates
// every length and count before use; no pickle, no payload bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "batchcast/common/error.h"
#include "batchcast/common/items.h"

namespace batchcast::protocol {

constexpr uint32_t kMagic = 0x54534342;  // "BCST"
constexpr uint16_t kVersion = 10;
constexpr std::size_t kHeaderBytes = 8;

// Limits that bound what a decoder will allocate for one message.
constexpr std::size_t kMaxDims = 16;
constexpr std::size_t kMaxLeaves = 4096;
constexpr std::size_t kMaxText = 16u << 20;
constexpr std::size_t kMaxItems = 1u << 24;
constexpr std::size_t kMaxReleases = 1u << 20;
constexpr std::size_t kMaxEvents = 4096;
constexpr std::size_t kUuidBytes = 16;
constexpr std::size_t kHandleBytes = 64;  // a CUDA IPC memory or event handle
constexpr std::size_t kMaxGroupName = 128;
constexpr int32_t kMaxWorldSize = 4096;

// Every message kind, in wire order: a kind's number on the wire is its place
// in this list (from 1), and the Kind enum, the Message variant and
// kind_name() are all made from it. A kind is added at the end (never
// reordered: numbers are the protocol); it then does not compile until its
// encoder, its decoder, the producer and the consumer each handle it.
#define BATCHCAST_MESSAGE_KINDS(X)                                                     \
  X(Hello) X(Welcome) X(Refuse) X(Announcement) X(EpochEnd) X(LoaderFailed) X(Finished) \
  X(Heartbeat) X(Release) X(Bye) X(RingReady) X(Evicted) X(Unmapped) X(StatusRequest)  \
  X(Status) X(Mapped) X(GroupReady) X(GroupBroken) X(MailboxReady)

enum class Kind : uint16_t {
  None = 0,  // no message has it
#define BATCHCAST_KIND_ENUM(name) name,
  BATCHCAST_MESSAGE_KINDS(BATCHCAST_KIND_ENUM)
#undef BATCHCAST_KIND_ENUM
};

// Every dtype batchcast shares, in wire order (a dtype's number on the wire
// is its place here, from 0; added at the end, never reordered), written
// once: X(wire name, bytes per element, name as torch writes it, torch's
// ScalarType, DLPack type code, DLPack bits). The wire (here), torch
// (dtype.cpp) and DLPack (python/dlpack.cpp) each take what they need of it.
#define BATCHCAST_DTYPES(X)                                    \
  X(UInt8, 1, "uint8", Byte, kDLUInt, 8)                       \
  X(Int8, 1, "int8", Char, kDLInt, 8)                          \
  X(Int16, 2, "int16", Short, kDLInt, 16)                      \
  X(Int32, 4, "int32", Int, kDLInt, 32)                        \
  X(Int64, 8, "int64", Long, kDLInt, 64)                       \
  X(Float16, 2, "float16", Half, kDLFloat, 16)                 \
  X(Float32, 4, "float32", Float, kDLFloat, 32)                \
  X(Float64, 8, "float64", Double, kDLFloat, 64)               \
  X(Bool, 1, "bool", Bool, kDLBool, 8)                         \
  X(BFloat16, 2, "bfloat16", BFloat16, kDLBfloat, 16)          \
  X(Complex64, 8, "complex64", ComplexFloat, kDLComplex, 64)   \
  X(Complex128, 16, "complex128", ComplexDouble, kDLComplex, 128) \
  X(UInt16, 2, "uint16", UInt16, kDLUInt, 16)                  \
  X(UInt32, 4, "uint32", UInt32, kDLUInt, 32)                  \
  X(UInt64, 8, "uint64", UInt64, kDLUInt, 64)

enum class DType : uint8_t {
#define BATCHCAST_DTYPE_ENUM(wire, bytes, name, scalar, code, bits) wire,
  BATCHCAST_DTYPES(BATCHCAST_DTYPE_ENUM)
#undef BATCHCAST_DTYPE_ENUM
};
#define BATCHCAST_DTYPE_COUNT(wire, bytes, name, scalar, code, bits) +1
constexpr uint8_t kDTypeCount = 0 BATCHCAST_DTYPES(BATCHCAST_DTYPE_COUNT);
#undef BATCHCAST_DTYPE_COUNT
// "bool, uint8, ...": the names of every dtype batchcast shares, for messages.
const char* dtype_names();
std::size_t element_size(DType dtype);
const char* dtype_name(DType dtype);

// Consumer -> producer: join.
struct Hello {
  static constexpr uint32_t kCatchUp = 1;  // join the current epoch from its start
  // Join with the next batch: the consumer's epochs are its own, each the next
  // samples_per_epoch samples from where it joined (a producer that steers its
  // loader's order keeps every one of them the whole dataset).
  static constexpr uint32_t kJoinNow = 2;
  int64_t pid = 0;
  uint32_t flags = 0;
  int64_t batch_size = 0;  // the consumer's own (0: the loader's batches as they are); for status
  // A rank of a consumer group (world_size > 0): the group's ranks split the
  // stream and count as one consumer; the group starts once all are present.
  std::string group;
  int32_t rank = 0;
  int32_t world_size = 0;
  // Resuming (resume_epoch >= 0): continue epoch resume_epoch at sample
  // position resume_position of the producer's stream. An epoch of a consumer
  // that joined mid-epoch begins at resume_joined_at of the producer's epoch of
  // that number (its positions count from there).
  int64_t resume_epoch = -1;
  int64_t resume_position = 0;
  int64_t resume_joined_at = 0;
  // The producer run the resumed state was saved in (Welcome::run; 0: not
  // known). A position of another run's epoch is not this run's to continue.
  uint64_t resume_run = 0;
  bool in_group() const { return world_size > 0; }
};

// How a resumed consumer (or group) continues; in Welcome or GroupReady.
enum class Resume : uint8_t {
  None = 0,      // not resuming: epochs from first_epoch, whole
  Exact = 1,     // epoch first_epoch from resume_position: the producer still held it
  NextPass = 2,  // the producer no longer held it: positions from resume_position of
                 // epoch first_epoch (the loader's next pass) stand in for the rest
};

// Where the ring lives: host shared memory (a memfd) or one allocation on a
// GPU, exported once with CUDA IPC together with one event per slot.
struct Ring {
  int32_t fd = -1;        // host: reopen as /proc/<producer_pid>/fd/<fd>
  uint64_t bytes = 0;     // 0: not created yet (it is sized from the first batch)
  std::string gpu_uuid;   // empty: host memory; else the GPU's 16-byte UUID
  std::string memory_handle;               // GPU: cudaIpcMemHandle_t of the ring
  std::vector<std::string> event_handles;  // GPU: cudaIpcEventHandle_t per slot event
  bool on_gpu() const { return !gpu_uuid.empty(); }
  bool exists() const { return bytes > 0; }
};

// Producer -> consumer: accepted; where the ring is and which epoch is yours.
struct Welcome {
  int64_t producer_pid = 0;
  // This run of the producer (random, never 0): a producer restarted under
  // the same name is another run, whose epochs are other passes.
  uint64_t run = 0;
  Ring ring;  // a GPU producer's UUID is set even before its ring exists
  uint64_t consumer_id = 0;
  int64_t first_epoch = 0;
  int64_t samples_per_epoch = -1;  // -1: unknown until the first epoch ends
  int64_t batches_per_epoch = -1;  // loader batches per epoch; -1: unknown until then
  int64_t slots = 0;               // batches the ring is sized for
  int32_t pin_budget = 0;          // see Announcement::pin_budget
  // A group's rank: first_epoch is -1 until GroupReady says it (once every
  // rank is present); resume then comes with GroupReady too.
  Resume resume = Resume::None;
  int64_t resume_position = 0;
  std::string loader;              // the producer's description of its loader (for resuming)
  // What the producer was doing when this consumer joined, for a consumer
  // that waits to say what for: the epoch it was serving (-1: none), and,
  // while it waited for consumers before its first epoch, how many it waits
  // for (0: it did not wait) and how many were present, this one included.
  int64_t producer_epoch = -1;
  int32_t consumers_wanted = 0;
  int32_t consumers_present = 0;
  // Where the consumer's epochs begin in the producer's: each is the samples
  // from this position of the producer's epoch of its number to this position
  // of the next (0: the producer's epochs as they are). Joining mid-epoch.
  int64_t joined_at = 0;
};

// Producer -> consumer: not accepted. Readable by every protocol version.
struct Refuse {
  std::string reason;
};

// One leaf of a loader batch that lives in the ring: contiguous, dim 0 = samples.
struct TensorLeaf {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // bytes from the start of the ring
  uint64_t nbytes() const;
};

// A per-sample list of non-tensor values (file names, ids), one item per sample.
using batchcast::ListKind;
struct ListLeaf {
  ListKind kind = ListKind::Text;
  std::vector<std::string> items;
};

using Leaf = std::variant<TensorLeaf, ListLeaf>;

// Producer -> consumer: loader batch `index` of `epoch` is in the ring.
struct Announcement {
  int64_t epoch = 0;
  int64_t index = 0;
  uint64_t seq = 0;  // ring slot sequence number, echoed back in Release
  int32_t event = -1;  // GPU ring: the slot event recorded after its copy; host: -1
  // Ring slots this consumer may keep pinned with batches it holds on to
  // (beyond the one it works on); past that it takes private copies, so that
  // what consumers keep never fills the ring. The producer's share per consumer.
  int32_t pin_budget = 0;
  int64_t samples = 0;
  int64_t position = 0;  // samples of its epoch before it: where it lies in the stream
  std::string layout;  // opaque structure description (JSON written by the Python package)
  std::vector<Leaf> leaves;
  // Each sample's index in the loader's dataset, in the batch's order, where
  // the producer knows them (its loader's sampler said); else empty, and a
  // sample is known by its position in the epoch (position + i).
  std::vector<int64_t> indices;
};

struct EpochEnd {
  int64_t epoch = 0;
  int64_t samples = 0;
  int64_t batches = 0;
};

// The stream ends in an error: the loader raised, or it yielded a batch the
// producer cannot share (an unsupported type, a tensor too large for the ring).
struct LoaderFailed {
  enum class Cause : uint8_t { LoaderRaised = 0, CannotShare = 1 };
  int64_t epoch = 0;
  std::string message;
  Cause cause = Cause::LoaderRaised;
};

// No more epochs. `epochs` is how many were served in full; `stopped`: the
// producer was stopped (or closed) before it served all it was asked to, as
// opposed to having served them.
struct Finished {
  int64_t epochs = 0;
  bool stopped = false;
};

struct Heartbeat {};

// Consumer -> producer: these slots are no longer referenced here.
struct Release {
  std::vector<uint64_t> seqs;
};

// Consumer -> producer: send me no more batches. The slots it still holds
// stay its own until released (its tensors remain valid).
struct Bye {};

// Consumer -> producer: this process holds nothing and has closed its
// mapping of the ring (a GPU ring may be freed only after every importer did).
struct Unmapped {};

// Consumer -> producer: this process has mapped the ring it was given. A
// producer that has served its last batch keeps the ring's file open until
// every consumer given the ring has mapped it (or left, or died, or linger ran
// out): a host ring is reopened through /proc/<producer pid>/fd.
struct Mapped {};

// Producer -> consumer: the ring exists now (it is sized from the first batch).
struct RingReady {
  Ring ring;
};

// Producer -> consumer: you were too slow and are no longer a member.
struct Evicted {
  std::string reason;
};

// Producer -> every rank of a group, once all of them are present: the
// group's first epoch (and how it resumes, if it asked to).
struct GroupReady {
  int64_t first_epoch = 0;
  Resume resume = Resume::None;
  int64_t resume_position = 0;
  int64_t joined_at = 0;  // as in Welcome
};

// Producer -> the other ranks of a group: a rank left, died or was evicted;
// the group gets nothing more from epoch `epoch` on (the epoch in progress,
// or the next one if it left between epochs).
struct GroupBroken {
  int64_t epoch = 0;
  std::string reason;
};

// Producer -> consumer, right after Welcome: from now on every message to
// this consumer comes through its mailbox (mailbox/mailbox.h), a memfd beside
// the ring, and it sends its releases back the same way; the socket carries
// only the messages the mailbox said were too large for it. Reopened, as a
// host ring is, through /proc/<producer pid>/fd.
struct MailboxReady {
  int32_t memory_fd = -1;      // the memfd of the mailbox
  uint64_t bytes = 0;          // its size
  uint64_t to_consumer = 0;    // bytes of the queue of messages to the consumer
  uint64_t to_producer = 0;    // bytes of the queue of releases to the producer
  int32_t consumer_bell = -1;  // a pipe the producer writes to wake this consumer
  int32_t producer_bell = -1;  // a pipe this consumer writes to wake the producer
};

// Anyone -> producer: what are you doing? Needs no membership.
struct StatusRequest {};

// Producer -> whoever asked: a JSON object (batchcast/status/status.h says
// what it holds). Text for people and tools, not for the data path.
struct Status {
  std::string json;
};

namespace detail {
template <typename Ignored, typename... Kinds>
struct VariantOf {
  using type = std::variant<Kinds...>;
};
}  // namespace detail

#define BATCHCAST_KIND_TYPE(name) , name
using Message =
    detail::VariantOf<void BATCHCAST_MESSAGE_KINDS(BATCHCAST_KIND_TYPE)>::type;
#undef BATCHCAST_KIND_TYPE

// The wire number of a kind, and of a message.
template <typename T, std::size_t I = 0>
constexpr Kind kind_of() {
  static_assert(I < std::variant_size_v<Message>, "not a message kind");
  if constexpr (std::is_same_v<T, std::variant_alternative_t<I, Message>>) {
    return static_cast<Kind>(I + 1);
  } else {
    return kind_of<T, I + 1>();
  }
}
inline Kind kind_of(const Message& message) { return static_cast<Kind>(message.index() + 1); }

#define BATCHCAST_KIND_CHECK(name) static_assert(kind_of<name>() == Kind::name);
BATCHCAST_MESSAGE_KINDS(BATCHCAST_KIND_CHECK)
#undef BATCHCAST_KIND_CHECK
static_assert(static_cast<uint16_t>(Kind::Refuse) == 3, "every version reads Refuse as kind 3");

// Dispatches a message to one handler per kind, with no fallback: handlers
// built with Exhaustive{...} stop compiling when a kind is added that they
// do not name.
template <typename... Handlers>
struct Exhaustive : Handlers... {
  using Handlers::operator()...;
};
template <typename... Handlers>
Exhaustive(Handlers...) -> Exhaustive<Handlers...>;

// A well-formed message of another protocol version.
class VersionMismatch : public MalformedMessage {
 public:
  explicit VersionMismatch(uint16_t version);
  uint16_t version() const { return version_; }

 private:
  uint16_t version_;
};

std::string encode(const Message& message);
std::string encode(const Message& message, uint16_t version);  // for tests of refusal

// Throws MalformedMessage (or VersionMismatch) for anything not exactly valid.
Message decode(const void* data, std::size_t size);
// The kind a message's header says, without decoding it (Kind::None when it
// is too short to have a header); the body is validated only by decode().
Kind peek_kind(const void* data, std::size_t size);

const char* kind_name(const Message& message);
const char* kind_name(Kind kind);  // "unknown" for a number no kind has

}  // namespace batchcast::protocol
