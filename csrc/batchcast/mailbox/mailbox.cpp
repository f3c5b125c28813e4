#include "batchcast/mailbox/mailbox.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "batchcast/common/error.h"

namespace batchcast {
namespace {

constexpr uint64_t kMagic = 0x58424c4d54534342;  // "BCSTMLBX"
constexpr uint32_t kLayoutVersion = 2;
constexpr uint64_t kDataOffset = 4096;

Fd reopen(long pid, int fd, int flags, const char* what) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  Fd out;
  do {
    out = Fd(::open(path.c_str(), flags | O_CLOEXEC));
  } while (!out.valid() && errno == EINTR);
  if (!out.valid()) throw SystemError(std::string("cannot open the producer's ") + what + " at " + path, errno);
  return out;
}

}  // namespace

struct Mailbox::Shared {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t to_consumer_bytes;
  uint64_t to_producer_bytes;
  uint64_t owner;  // the consumer's id: a reader checks the mailbox it opened is its own
  FrameQueue::Indices to_consumer;
  FrameQueue::Indices to_producer;
  alignas(64) std::atomic<uint32_t> consumer_asleep;
  alignas(64) std::atomic<uint32_t> producer_asleep;
};

std::unique_ptr<Mailbox> Mailbox::create(const std::string& label, int producer_bell, uint64_t owner) {
  static_assert(sizeof(Shared) <= kDataOffset);
  static_assert(std::atomic<uint32_t>::is_always_lock_free);
  std::unique_ptr<Mailbox> m(new Mailbox());
  const uint64_t bytes = kDataOffset + kToConsumerBytes + kToProducerBytes;
  m->memory_ = Fd(::memfd_create(("batchcast-mailbox:" + label).c_str(), MFD_CLOEXEC));
  if (!m->memory_.valid()) throw SystemError("memfd_create for a mailbox", errno);
  if (::ftruncate(m->memory_.get(), static_cast<off_t>(bytes)) != 0) {
    throw SystemError("cannot size a mailbox", errno);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->memory_.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of a mailbox", errno);
  m->mapping_ = Mapping(p, bytes);
  // A fresh memfd reads as zeros: the indices and flags start at 0.
  auto* s = static_cast<Shared*>(p);
  s->magic = kMagic;
  s->version = kLayoutVersion;
  s->to_consumer_bytes = kToConsumerBytes;
  s->to_producer_bytes = kToProducerBytes;
  s->owner = owner;
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) throw SystemError("pipe for a mailbox", errno);
  m->consumer_bell_ = Fd(fds[0]);
  m->consumer_bell_write_ = Fd(fds[1]);
  m->producer_bell_number_ = producer_bell;
  m->attach(kToConsumerBytes, kToProducerBytes);
  return m;
}

protocol::MailboxReady Mailbox::description() const {
  protocol::MailboxReady d;
  d.memory_fd = memory_.get();
  d.bytes = mapping_.size();
  d.to_consumer = kToConsumerBytes;
  d.to_producer = kToProducerBytes;
  d.consumer_bell = consumer_bell_.get();
  d.producer_bell = producer_bell_number_;
  return d;
}

std::unique_ptr<Mailbox> Mailbox::open(const protocol::MailboxReady& ready, long producer_pid, uint64_t owner) {
  auto bad = [](const char* what) { return MalformedMessage(std::string("mailbox: ") + what); };
  if (ready.to_consumer < 64 || ready.to_producer < 64 || ready.to_consumer % 8 != 0 ||
      ready.to_producer % 8 != 0 || ready.to_consumer > (1u << 30) || ready.to_producer > (1u << 30) ||
      ready.bytes != kDataOffset + ready.to_consumer + ready.to_producer) {
    throw bad("sizes that do not add up");
  }
  std::unique_ptr<Mailbox> m(new Mailbox());
  Fd memory = reopen(producer_pid, ready.memory_fd, O_RDWR, "mailbox");
  const off_t actual = ::lseek(memory.get(), 0, SEEK_END);
  if (actual < 0 || static_cast<uint64_t>(actual) < ready.bytes) throw bad("smaller than announced");
  void* p = ::mmap(nullptr, ready.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory.get(), 0);
  if (p == MAP_FAILED) throw SystemError("mmap of the producer's mailbox", errno);
  m->mapping_ = Mapping(p, ready.bytes);
  const auto* s = static_cast<const Shared*>(p);
  if (s->magic != kMagic || s->version != kLayoutVersion || s->to_consumer_bytes != ready.to_consumer ||
      s->to_producer_bytes != ready.to_producer) {
    throw bad("not a mailbox of this version");
  }
  if (s->owner != owner) {
    throw bad(("consumer " + std::to_string(s->owner) + "'s, not this consumer's (" + std::to_string(owner) +
               ")").c_str());
  }
  m->consumer_bell_ = reopen(producer_pid, ready.consumer_bell, O_RDWR | O_NONBLOCK, "mailbox bell");
  m->producer_bell_ = reopen(producer_pid, ready.producer_bell, O_RDWR | O_NONBLOCK, "bell");
  m->attach(ready.to_consumer, ready.to_producer);
  return m;
}

void Mailbox::attach(uint64_t to_consumer, uint64_t to_producer) {
  shared_ = reinterpret_cast<Shared*>(mapping_.data());
  to_consumer_ = FrameQueue(&shared_->to_consumer, mapping_.data() + kDataOffset, to_consumer);
  to_producer_ =
      FrameQueue(&shared_->to_producer, mapping_.data() + kDataOffset + to_consumer, to_producer);
}

Mailbox::~Mailbox() = default;

void Mailbox::ring(int bell) {
  const char one = 1;
  // Non-blocking: a full pipe has been rung already.
  while (::write(bell, &one, 1) < 0 && errno == EINTR) {
  }
}

// ---- producer side

FrameQueue::Push Mailbox::post(const std::string& frame) {
  return rang_consumer(to_consumer_.push(frame.data(), frame.size()));
}

FrameQueue::Push Mailbox::post_marker() { return rang_consumer(to_consumer_.push_marker()); }

// After a push: a consumer that said it sleeps is rung, once.
FrameQueue::Push Mailbox::rang_consumer(FrameQueue::Push pushed) {
  if (pushed == FrameQueue::Push::Done && shared_->consumer_asleep.load(std::memory_order_seq_cst) != 0 &&
      shared_->consumer_asleep.exchange(0) != 0) {
    ring(consumer_bell_write_.get());
  }
  return pushed;
}

FrameQueue::Pop Mailbox::collect(std::string& out) { return to_producer_.pop(out); }

bool Mailbox::consumer_waits() const {
  return shared_->consumer_asleep.load(std::memory_order_seq_cst) != 0 && to_consumer_.all_read();
}

bool Mailbox::producer_sleeps(bool for_releases, bool for_room) {
  shared_->producer_asleep.store((for_releases ? kForReleases : 0u) | (for_room ? kForRoom : 0u),
                                 std::memory_order_seq_cst);
  return to_producer_.has_unread();
}

// ---- consumer side

FrameQueue::Pop Mailbox::receive(std::string& out) { return to_consumer_.pop(out); }

FrameQueue::Push Mailbox::send(const std::string& frame) {
  auto r = to_producer_.push(frame.data(), frame.size());
  if (r == FrameQueue::Push::Done) ring_producer(kForReleases);
  return r;
}

void Mailbox::made_room() { ring_producer(kForRoom); }

// One ring per time the producer asked (whichever it asked for goes down with it).
void Mailbox::ring_producer(uint32_t reason) {
  if ((shared_->producer_asleep.load(std::memory_order_seq_cst) & reason) != 0 &&
      shared_->producer_asleep.exchange(0) != 0) {
    ring(producer_bell_.get());
  }
}

bool Mailbox::consumer_sleeps() {
  shared_->consumer_asleep.store(1, std::memory_order_seq_cst);
  if (!to_consumer_.has_unread()) return true;
  shared_->consumer_asleep.store(0, std::memory_order_relaxed);
  return false;
}

void Mailbox::consumer_woke() {
  shared_->consumer_asleep.store(0, std::memory_order_relaxed);
  empty_bell(consumer_bell_.get());
}

void Mailbox::empty_bell(int bell) {
  char buf[64];
  while (true) {
    const ssize_t n = ::read(bell, buf, sizeof buf);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    return;  // empty (EAGAIN)
  }
}

}  // namespace batchcast
