// What the simulated machine is: the options BATCHCAST_SIMULATED_CUDA
// gives it, and the devices a process sees of it through CUDA_VISIBLE_DEVICES.
#include "batchcast/cuda/simulated_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <stdexcept>

#include "batchcast/common/error.h"

namespace batchcast::cuda::simulated {

Options parse_options(const std::string& spec) {
  Options o;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t end = std::min(spec.find(',', start), spec.size());
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    long long value = 0;
    try {
      std::size_t used = 0;
      if (eq == std::string::npos) throw std::invalid_argument("no value");
      value = std::stoll(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw InvalidArgument("BATCHCAST_SIMULATED_CUDA: '" + item + "' is not key=integer");
    }
    if (key == "seed") {
      o.seed = static_cast<uint64_t>(value);
    } else if (key == "max_delay_us" && value >= 0) {
      o.max_delay_us = value;
    } else if (key == "devices" && value >= 1 && value <= 8) {
      o.devices = static_cast<int>(value);
    } else {
      throw InvalidArgument("BATCHCAST_SIMULATED_CUDA: '" + item +
                            "' is not one of seed=N, max_delay_us=N (>= 0), devices=N (1 to 8)");
    }
  }
  return o;
}

// As the driver: CUDA_VISIBLE_DEVICES lists the devices this process sees, in
// its order, numbered from 0; the list ends at its first entry that is not a
// device (or one named twice). Unset: every device, as numbered.
std::vector<int> visible_devices(int devices) {
  std::vector<int> out;
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr) {
    for (int d = 0; d < devices; ++d) out.push_back(d);
    return out;
  }
  std::string list(env);
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    std::string entry = list.substr(at, comma - at);
    entry.erase(0, entry.find_first_not_of(' '));
    entry.erase(entry.find_last_not_of(' ') + 1);
    if (entry.empty() || entry.find_first_not_of("0123456789") != std::string::npos || entry.size() > 3) break;
    const int d = std::stoi(entry);
    if (d >= devices || std::find(out.begin(), out.end(), d) != out.end()) break;
    out.push_back(d);
    at = comma + 1;
  }
  return out;
}

}  // namespace batchcast::cuda::simulated
