#include "batchcast/protocol/message.h"

#include <array>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>
#include <utility>

namespace batchcast::protocol {
namespace {

#define BATCHCAST_DTYPE_SIZE(wire, bytes, name, scalar, code, bits) bytes,
constexpr std::size_t kElementSizes[kDTypeCount] = {BATCHCAST_DTYPES(BATCHCAST_DTYPE_SIZE)};
#undef BATCHCAST_DTYPE_SIZE
#define BATCHCAST_DTYPE_NAME(wire, bytes, name, scalar, code, bits) name,
constexpr const char* kDTypeNames[kDTypeCount] = {BATCHCAST_DTYPES(BATCHCAST_DTYPE_NAME)};
#undef BATCHCAST_DTYPE_NAME
#define BATCHCAST_DTYPE_LISTED(wire, bytes, name, scalar, code, bits) ", " name
constexpr const char* kDTypeList = &BATCHCAST_DTYPES(BATCHCAST_DTYPE_LISTED)[2];  // without the first ", "
#undef BATCHCAST_DTYPE_LISTED

class Writer {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void text(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void raw(const std::string& s) { out_.append(s); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const char* data, std::size_t size) : p_(data), end_(data + size) {}

  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T value;
    std::memcpy(&value, p_, sizeof(T));
    p_ += sizeof(T);
    return value;
  }
  std::string text(std::size_t limit) {
    auto n = get<uint32_t>();
    if (n > limit) throw MalformedMessage("string of " + std::to_string(n) + " bytes exceeds limit");
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  // A count of elements that each take at least `min_bytes`: rejects counts
  // that cannot fit in what is left before allocating anything.
  std::size_t count(std::size_t limit, std::size_t min_bytes) {
    auto n = get<uint32_t>();
    if (n > limit) throw MalformedMessage("count " + std::to_string(n) + " exceeds limit");
    if (min_bytes > 0 && n > remaining() / min_bytes) throw MalformedMessage("count exceeds message");
    return n;
  }
  std::string raw(std::size_t n) {
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  void finish() const {
    if (p_ != end_) throw MalformedMessage(std::to_string(remaining()) + " trailing bytes");
  }

 private:
  void need(std::size_t n) const {
    if (remaining() < n) throw MalformedMessage("truncated message");
  }
  const char* p_;
  const char* end_;
};

void encode_ring(Writer& w, const Ring& ring) {
  w.put<int32_t>(ring.fd);
  w.put<uint64_t>(ring.bytes);
  w.put<uint8_t>(ring.on_gpu() ? 1 : 0);
  if (!ring.on_gpu()) return;
  w.raw(ring.gpu_uuid);
  w.put<uint8_t>(ring.exists() ? 1 : 0);
  if (!ring.exists()) return;
  w.raw(ring.memory_handle);
  w.put<uint32_t>(static_cast<uint32_t>(ring.event_handles.size()));
  for (const auto& h : ring.event_handles) w.raw(h);
}

// Exactly one shape per kind: a host ring has an fd once it exists; a GPU ring
// never has an fd, and once it exists has its memory handle and >= 1 event.
Ring decode_ring(Reader& r) {
  Ring ring;
  ring.fd = r.get<int32_t>();
  ring.bytes = r.get<uint64_t>();
  auto location = r.get<uint8_t>();
  if (location == 0) {
    if ((ring.fd >= 0) != ring.exists() || ring.fd < -1) throw MalformedMessage("bad host ring");
    return ring;
  }
  if (location != 1 || ring.fd != -1) throw MalformedMessage("bad ring location");
  ring.gpu_uuid = r.raw(kUuidBytes);
  auto exists = r.get<uint8_t>();
  if (exists > 1 || (exists == 1) != ring.exists()) throw MalformedMessage("bad GPU ring");
  if (!ring.exists()) return ring;
  ring.memory_handle = r.raw(kHandleBytes);
  std::size_t n = r.count(kMaxEvents, kHandleBytes);
  if (n == 0) throw MalformedMessage("GPU ring without events");
  for (std::size_t i = 0; i < n; ++i) ring.event_handles.push_back(r.raw(kHandleBytes));
  return ring;
}

void encode_leaf(Writer& w, const Leaf& leaf) {
  if (const auto* t = std::get_if<TensorLeaf>(&leaf)) {
    w.put<uint8_t>(1);
    w.put<uint8_t>(static_cast<uint8_t>(t->dtype));
    w.put<uint8_t>(static_cast<uint8_t>(t->shape.size()));
    for (int64_t d : t->shape) w.put<int64_t>(d);
    w.put<uint64_t>(t->offset);
  } else {
    const auto& l = std::get<ListLeaf>(leaf);
    w.put<uint8_t>(2);
    w.put<uint8_t>(static_cast<uint8_t>(l.kind));
    w.put<uint32_t>(static_cast<uint32_t>(l.items.size()));
    for (const auto& item : l.items) w.text(item);
  }
}

Leaf decode_leaf(Reader& r, int64_t samples) {
  auto tag = r.get<uint8_t>();
  if (tag == 1) {
    TensorLeaf t;
    auto dtype = r.get<uint8_t>();
    if (dtype >= kDTypeCount) throw MalformedMessage("unknown dtype " + std::to_string(dtype));
    t.dtype = static_cast<DType>(dtype);
    auto ndim = r.get<uint8_t>();
    if (ndim == 0 || ndim > kMaxDims) throw MalformedMessage("bad tensor rank");
    t.shape.resize(ndim);
    for (auto& d : t.shape) {
      d = r.get<int64_t>();
      if (d < 0) throw MalformedMessage("negative dimension");
    }
    if (t.shape[0] != samples) throw MalformedMessage("tensor rows differ from batch samples");
    // Reject sizes whose byte count would overflow.
    unsigned __int128 bytes = element_size(t.dtype);
    for (int64_t d : t.shape) {
      bytes *= static_cast<uint64_t>(d);
      if (bytes > std::numeric_limits<uint64_t>::max() / 2) throw MalformedMessage("tensor too large");
    }
    t.offset = r.get<uint64_t>();
    if (t.offset > std::numeric_limits<uint64_t>::max() / 2) throw MalformedMessage("bad offset");
    return t;
  }
  if (tag == 2) {
    ListLeaf l;
    auto kind = r.get<uint8_t>();
    if (kind != 1 && kind != 2) throw MalformedMessage("unknown list kind");
    l.kind = static_cast<ListKind>(kind);
    std::size_t n = r.count(kMaxItems, sizeof(uint32_t));
    if (static_cast<int64_t>(n) != samples) throw MalformedMessage("list length differs from samples");
    l.items.reserve(n);
    for (std::size_t i = 0; i < n; ++i) l.items.push_back(r.text(kMaxText));
    return l;
  }
  throw MalformedMessage("unknown leaf tag");
}

Resume resume_from(uint8_t value) {
  if (value > static_cast<uint8_t>(Resume::NextPass)) throw MalformedMessage("bad resume kind");
  return static_cast<Resume>(value);
}

}  // namespace

std::size_t element_size(DType dtype) { return kElementSizes[static_cast<uint8_t>(dtype)]; }
const char* dtype_name(DType dtype) { return kDTypeNames[static_cast<uint8_t>(dtype)]; }
const char* dtype_names() { return kDTypeList; }

uint64_t TensorLeaf::nbytes() const {
  uint64_t n = element_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

VersionMismatch::VersionMismatch(uint16_t version)
    : MalformedMessage("protocol version " + std::to_string(version) + ", this side speaks " +
                       std::to_string(kVersion)),
      version_(version) {}

namespace {

// ---- one encoder and one decoder per kind -------------------------------------
// Overloads, not a generic fallback: a kind added to the list without its
// pair does not compile.

void write(Writer& w, const Hello& m) {
  w.put<int64_t>(m.pid);
  w.put<uint32_t>(m.flags);
  w.put<int64_t>(m.batch_size);
  w.text(m.group);
  w.put<int32_t>(m.rank);
  w.put<int32_t>(m.world_size);
  w.put<int64_t>(m.resume_epoch);
  w.put<int64_t>(m.resume_position);
  w.put<int64_t>(m.resume_joined_at);
  w.put<uint64_t>(m.resume_run);
}
void read(Reader& r, Hello& m) {
  m.pid = r.get<int64_t>();
  m.flags = r.get<uint32_t>();
  m.batch_size = r.get<int64_t>();
  m.group = r.text(kMaxGroupName);
  m.rank = r.get<int32_t>();
  m.world_size = r.get<int32_t>();
  m.resume_epoch = r.get<int64_t>();
  m.resume_position = r.get<int64_t>();
  m.resume_joined_at = r.get<int64_t>();
  m.resume_run = r.get<uint64_t>();
  if (m.batch_size < 0) throw MalformedMessage("negative batch size");
  if (m.world_size < 0 || m.world_size > kMaxWorldSize || m.rank < 0 ||
      (m.world_size > 0 ? (m.rank >= m.world_size || m.group.empty())
                        : (m.rank != 0 || !m.group.empty()))) {
    throw MalformedMessage("bad group");
  }
  if (m.resume_epoch < -1 || m.resume_position < 0 || m.resume_joined_at < 0) throw MalformedMessage("bad resume");
}

void write(Writer& w, const Welcome& m) {
  w.put<int64_t>(m.producer_pid);
  w.put<uint64_t>(m.run);
  encode_ring(w, m.ring);
  w.put<uint64_t>(m.consumer_id);
  w.put<int64_t>(m.first_epoch);
  w.put<int64_t>(m.samples_per_epoch);
  w.put<int64_t>(m.batches_per_epoch);
  w.put<int64_t>(m.slots);
  w.put<int32_t>(m.pin_budget);
  w.put<uint8_t>(static_cast<uint8_t>(m.resume));
  w.put<int64_t>(m.resume_position);
  w.text(m.loader);
  w.put<int64_t>(m.producer_epoch);
  w.put<int32_t>(m.consumers_wanted);
  w.put<int32_t>(m.consumers_present);
  w.put<int64_t>(m.joined_at);
}
void read(Reader& r, Welcome& m) {
  m.producer_pid = r.get<int64_t>();
  m.run = r.get<uint64_t>();
  m.ring = decode_ring(r);
  m.consumer_id = r.get<uint64_t>();
  m.first_epoch = r.get<int64_t>();
  m.samples_per_epoch = r.get<int64_t>();
  m.batches_per_epoch = r.get<int64_t>();
  m.slots = r.get<int64_t>();
  m.pin_budget = r.get<int32_t>();
  m.resume = resume_from(r.get<uint8_t>());
  m.resume_position = r.get<int64_t>();
  m.loader = r.text(kMaxText);
  m.producer_epoch = r.get<int64_t>();
  m.consumers_wanted = r.get<int32_t>();
  m.consumers_present = r.get<int32_t>();
  m.joined_at = r.get<int64_t>();
  if (m.slots < 2 || m.producer_pid <= 0 || m.run == 0 || m.first_epoch < -1 || m.samples_per_epoch < -1 ||
      m.batches_per_epoch < -1 || m.pin_budget < 0 || m.resume_position < 0 || m.producer_epoch < -1 ||
      m.consumers_wanted < 0 || m.consumers_present < 0 || m.joined_at < 0) {
    throw MalformedMessage("bad welcome");
  }
}

void write(Writer& w, const Refuse& m) { w.text(m.reason); }
void read(Reader& r, Refuse& m) { m.reason = r.text(kMaxText); }

void write(Writer& w, const Announcement& m) {
  w.put<int64_t>(m.epoch);
  w.put<int64_t>(m.index);
  w.put<uint64_t>(m.seq);
  w.put<int32_t>(m.event);
  w.put<int32_t>(m.pin_budget);
  w.put<int64_t>(m.samples);
  w.put<int64_t>(m.position);
  w.text(m.layout);
  w.put<uint32_t>(static_cast<uint32_t>(m.leaves.size()));
  for (const auto& leaf : m.leaves) encode_leaf(w, leaf);
  w.put<uint32_t>(static_cast<uint32_t>(m.indices.size()));
  if (!m.indices.empty()) {
    w.raw(std::string(reinterpret_cast<const char*>(m.indices.data()), m.indices.size() * sizeof(int64_t)));
  }
}
void read(Reader& r, Announcement& m) {
  m.epoch = r.get<int64_t>();
  m.index = r.get<int64_t>();
  m.seq = r.get<uint64_t>();
  m.event = r.get<int32_t>();
  m.pin_budget = r.get<int32_t>();
  m.samples = r.get<int64_t>();
  m.position = r.get<int64_t>();
  if (m.epoch < 0 || m.index < 0 || m.samples < 0 || m.position < 0 || m.event < -1 ||
      m.pin_budget < 0 || m.event >= static_cast<int32_t>(kMaxEvents)) {
    throw MalformedMessage("bad announcement field");
  }
  m.layout = r.text(kMaxText);
  std::size_t n = r.count(kMaxLeaves, 2);
  m.leaves.reserve(n);
  for (std::size_t i = 0; i < n; ++i) m.leaves.push_back(decode_leaf(r, m.samples));
  const std::size_t k = r.count(kMaxItems, sizeof(int64_t));
  if (k != 0 && k != static_cast<uint64_t>(m.samples)) {
    throw MalformedMessage("announcement of " + std::to_string(m.samples) + " samples with " + std::to_string(k) +
                           " sample indices");
  }
  if (k != 0) {
    m.indices.resize(k);
    const std::string bytes = r.raw(k * sizeof(int64_t));
    std::memcpy(m.indices.data(), bytes.data(), bytes.size());
  }
}

void write(Writer& w, const EpochEnd& m) {
  w.put<int64_t>(m.epoch);
  w.put<int64_t>(m.samples);
  w.put<int64_t>(m.batches);
}
void read(Reader& r, EpochEnd& m) {
  m.epoch = r.get<int64_t>();
  m.samples = r.get<int64_t>();
  m.batches = r.get<int64_t>();
  if (m.epoch < 0 || m.samples < 0 || m.batches < 0) throw MalformedMessage("negative field");
}

void write(Writer& w, const LoaderFailed& m) {
  w.put<int64_t>(m.epoch);
  w.text(m.message);
  w.put<uint8_t>(static_cast<uint8_t>(m.cause));
}
void read(Reader& r, LoaderFailed& m) {
  m.epoch = r.get<int64_t>();
  m.message = r.text(kMaxText);
  const auto cause = r.get<uint8_t>();
  if (cause > static_cast<uint8_t>(LoaderFailed::Cause::CannotShare)) throw MalformedMessage("unknown cause");
  m.cause = static_cast<LoaderFailed::Cause>(cause);
}

void write(Writer& w, const Finished& m) {
  w.put<int64_t>(m.epochs);
  w.put<uint8_t>(m.stopped ? 1 : 0);
}
void read(Reader& r, Finished& m) {
  m.epochs = r.get<int64_t>();
  const auto stopped = r.get<uint8_t>();
  if (stopped > 1 || m.epochs < 0) throw MalformedMessage("bad Finished");
  m.stopped = stopped == 1;
}

void write(Writer&, const Heartbeat&) {}
void read(Reader&, Heartbeat&) {}

void write(Writer& w, const Release& m) {
  w.put<uint32_t>(static_cast<uint32_t>(m.seqs.size()));
  for (uint64_t s : m.seqs) w.put<uint64_t>(s);
}
void read(Reader& r, Release& m) {
  std::size_t n = r.count(kMaxReleases, sizeof(uint64_t));
  m.seqs.resize(n);
  for (auto& s : m.seqs) s = r.get<uint64_t>();
}

void write(Writer&, const Bye&) {}
void read(Reader&, Bye&) {}

void write(Writer& w, const RingReady& m) { encode_ring(w, m.ring); }
void read(Reader& r, RingReady& m) {
  m.ring = decode_ring(r);
  if (!m.ring.exists()) throw MalformedMessage("ring without memory");
}

void write(Writer& w, const Evicted& m) { w.text(m.reason); }
void read(Reader& r, Evicted& m) { m.reason = r.text(kMaxText); }

void write(Writer&, const Unmapped&) {}
void read(Reader&, Unmapped&) {}

void write(Writer&, const StatusRequest&) {}
void read(Reader&, StatusRequest&) {}

void write(Writer& w, const Status& m) { w.text(m.json); }
void read(Reader& r, Status& m) { m.json = r.text(kMaxText); }

void write(Writer&, const Mapped&) {}
void read(Reader&, Mapped&) {}

void write(Writer& w, const GroupReady& m) {
  w.put<int64_t>(m.first_epoch);
  w.put<uint8_t>(static_cast<uint8_t>(m.resume));
  w.put<int64_t>(m.resume_position);
  w.put<int64_t>(m.joined_at);
}
void read(Reader& r, GroupReady& m) {
  m.first_epoch = r.get<int64_t>();
  m.resume = resume_from(r.get<uint8_t>());
  m.resume_position = r.get<int64_t>();
  m.joined_at = r.get<int64_t>();
  if (m.first_epoch < 0 || m.resume_position < 0 || m.joined_at < 0) {
    throw MalformedMessage("bad group ready");
  }
}

void write(Writer& w, const GroupBroken& m) {
  w.put<int64_t>(m.epoch);
  w.text(m.reason);
}
void read(Reader& r, GroupBroken& m) {
  m.epoch = r.get<int64_t>();
  m.reason = r.text(kMaxText);
  if (m.epoch < 0) throw MalformedMessage("bad group broken");
}

void write(Writer& w, const MailboxReady& m) {
  w.put<int32_t>(m.memory_fd);
  w.put<uint64_t>(m.bytes);
  w.put<uint64_t>(m.to_consumer);
  w.put<uint64_t>(m.to_producer);
  w.put<int32_t>(m.consumer_bell);
  w.put<int32_t>(m.producer_bell);
}
void read(Reader& r, MailboxReady& m) {
  m.memory_fd = r.get<int32_t>();
  m.bytes = r.get<uint64_t>();
  m.to_consumer = r.get<uint64_t>();
  m.to_producer = r.get<uint64_t>();
  m.consumer_bell = r.get<int32_t>();
  m.producer_bell = r.get<int32_t>();
  if (m.memory_fd < 0 || m.consumer_bell < 0 || m.producer_bell < 0) {
    throw MalformedMessage("bad mailbox descriptor");
  }
  // The queues' sizes are checked against the layout where the mailbox is opened.
}

template <typename T>
Message decode_as(Reader& r) {
  T m;
  read(r, m);
  return m;
}

using Decoder = Message (*)(Reader&);
template <std::size_t... I>
constexpr std::array<Decoder, sizeof...(I)> make_decoders(std::index_sequence<I...>) {
  return {&decode_as<std::variant_alternative_t<I, Message>>...};
}
// kDecoders[k - 1] decodes the body of kind k.
constexpr auto kDecoders = make_decoders(std::make_index_sequence<std::variant_size_v<Message>>());

#define BATCHCAST_KIND_NAME(name) #name,
constexpr const char* kKindNames[] = {BATCHCAST_MESSAGE_KINDS(BATCHCAST_KIND_NAME)};
#undef BATCHCAST_KIND_NAME
static_assert(std::size(kKindNames) == std::variant_size_v<Message>);

}  // namespace

std::string encode(const Message& message) { return encode(message, kVersion); }

std::string encode(const Message& message, uint16_t version) {
  Writer w;
  w.put<uint32_t>(kMagic);
  w.put<uint16_t>(version);
  w.put<uint16_t>(static_cast<uint16_t>(kind_of(message)));
  std::visit([&](const auto& m) { write(w, m); }, message);
  return w.take();
}

Message decode(const void* data, std::size_t size) {
  Reader r(static_cast<const char*>(data), size);
  if (r.get<uint32_t>() != kMagic) throw MalformedMessage("bad magic");
  auto version = r.get<uint16_t>();
  auto kind = r.get<uint16_t>();
  if (kind != static_cast<uint16_t>(Kind::Refuse) && version != kVersion) {
    throw VersionMismatch(version);  // Refuse: the one message every version can read
  }
  if (kind == 0 || kind > kDecoders.size()) {
    throw MalformedMessage("unknown message kind " + std::to_string(kind));
  }
  Message out = kDecoders[kind - 1](r);
  r.finish();
  return out;
}

Kind peek_kind(const void* data, std::size_t size) {
  if (size < kHeaderBytes) return Kind::None;
  uint16_t kind = 0;
  std::memcpy(&kind, static_cast<const char*>(data) + sizeof(uint32_t) + sizeof(uint16_t), sizeof kind);
  return kind >= 1 && kind <= std::size(kKindNames) ? static_cast<Kind>(kind) : Kind::None;
}

const char* kind_name(const Message& message) { return kKindNames[message.index()]; }

const char* kind_name(Kind kind) {
  auto k = static_cast<std::size_t>(kind);
  return k >= 1 && k <= std::size(kKindNames) ? kKindNames[k - 1] : "unknown";
}

}  // namespace batchcast::protocol
