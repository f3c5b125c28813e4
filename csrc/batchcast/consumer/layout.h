// Reads the structure description (layout) that the Python package writes with
// each loader batch (python/batchcast/_structure.py), only to say in words
// what changed when a consumer batch would join loader batches of different
// structures, and where a tensor leaf sits. Rebatching itself compares
// layouts as opaque text: equal text is the same structure.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace batchcast::layout {

// What differs between two layouts, first difference in the structure's
// order ("at batch['x']: a tensor became a dict"); nullopt when they describe
// the same structure. Text that is not a layout is compared as it is.
std::optional<std::string> describe_change(const std::string& before, const std::string& after);

// Where leaf `index` (a tensor or a per-sample list) sits in the structure
// ("batch['image']"), or "leaf <index>" when the layout does not say.
std::string leaf_path(const std::string& layout, std::size_t index);

// The keys that lead to leaf `index` from the batch: dict keys, positions in
// a tuple or list, a named tuple's field names, each as its text; none for a
// batch that is the leaf itself (or a layout that does not say).
std::vector<std::string> leaf_keys(const std::string& layout, std::size_t index);
// The same keys as a user writes them in Python: 'image', 0, ('inputs', 'ids').
std::string leaf_key(const std::string& layout, std::size_t index);

}  // namespace batchcast::layout
