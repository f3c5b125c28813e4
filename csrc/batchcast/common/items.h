// Per-sample values that are not tensors (file names, ids, JSON-able values):
// one item per sample, carried as text. No torch here: the wire format uses it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace batchcast {

// How the items of a per-sample list are to be read back.
enum class ListKind : uint8_t {
  Text = 1,  // str
  Json = 2,  // any other JSON value (int, float, bool, None, nested lists/dicts)
};

struct Items {
  ListKind kind = ListKind::Text;
  std::vector<std::string> values;
};

}  // namespace batchcast
