// What the core has to tell its user, without printing anything: events for a
// log (joins, evictions) and warnings about things the user should fix. The
// embedding program decides where they go; the Python package routes them to
// `logging.getLogger("batchcast")` and `warnings.warn`.
#pragma once

#include <functional>
#include <string>

namespace batchcast {

struct Report {
  enum class Level {
    Debug,    // detail for diagnosing
    Info,     // an event: a consumer joined, left, crashed, was evicted
    Notice,   // an event worth attention: waiting on consumers, a fallback taken
    Warning,  // something the user should fix (Python: warnings.warn)
  };
  Level level = Level::Info;
  // For warnings, what kind (so that users can filter): "KeptBatches", "Linger".
  std::string kind;
  std::string message;
};

// Called without any batchcast lock held, on whichever thread noticed; must
// not throw and must not call back into the object that reported.
using Reporter = std::function<void(const Report&)>;

}  // namespace batchcast
