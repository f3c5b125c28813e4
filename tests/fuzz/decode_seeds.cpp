// Decodes each file named on the command line as one protocol message and
// fails naming those that do not decode: the fuzzers' seeds must be valid
// messages of the current protocol, or the fuzzer starts from refusals only.
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "batchcast/protocol/message.h"

int main(int argc, char** argv) {
  int failed = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream file(argv[i], std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    try {
      (void)batchcast::protocol::decode(bytes.data(), bytes.size());
    } catch (const std::exception& e) {
      std::cerr << "seed " << argv[i] << " does not decode: " << e.what() << "\n";
      failed += 1;
    }
  }
  return failed == 0 ? 0 : 1;
}
