// Consumers map the ring read-only, so an in-place write into a batch faults.
// This guard turns that SIGSEGV into a message that says what happened and
// what to do, then lets the crash proceed as it would have.
#pragma once

#include <cstddef>

namespace batchcast {

void guard_readonly_range(const void* begin, std::size_t size);
void unguard_readonly_range(const void* begin);

}  // namespace batchcast
