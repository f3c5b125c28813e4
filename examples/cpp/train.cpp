// A LibTorch training loop fed by a batchcast producer: the C++ side of
// batchcast::Consumer, as a training program would use it.
//
//   python examples/cpp/serve.py cpp-demo &           # a Python producer
//   build/dev/example_train cpp-demo --batch-size 48   # this trainer
//
// The producer serves (features [N, 16] float32, label [N] int64, index [N]
// int64) batches; this program trains a small MLP with SGD on them, checks
// that every sample arrived exactly once per epoch, prints one line per epoch
// and, with --report FILE, writes the same as JSON. Build it with
// -DBATCHCAST_BUILD_EXAMPLES=ON.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "batchcast/consumer/consumer.h"
#include "batchcast/tensor/aten.h"  // batchcast's tensors as at::Tensor

namespace {

struct Args {
  std::string name;
  int64_t batch_size = 32;
  int epochs = 3;
  double lr = 0.5;
  double timeout = 30.0;
  bool join_now = false;
  std::string report;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "example_train: %s\n"
               "usage: example_train NAME [--batch-size B] [--epochs E] [--lr LR] "
               "[--timeout SECONDS] [--join-now] [--report FILE]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
      return argv[++i];
    };
    try {
      if (arg == "--batch-size") a.batch_size = std::stoll(value());
      else if (arg == "--epochs") a.epochs = std::stoi(value());
      else if (arg == "--lr") a.lr = std::stod(value());
      else if (arg == "--timeout") a.timeout = std::stod(value());
      else if (arg == "--report") a.report = value();
      else if (arg == "--join-now") a.join_now = true;
      else if (!arg.empty() && arg[0] == '-') usage(("unknown option " + arg).c_str());
      else if (a.name.empty()) a.name = arg;
      else usage(("unexpected argument " + arg).c_str());
    } catch (const std::logic_error&) {
      usage(("bad number for " + arg).c_str());
    }
  }
  if (a.name.empty()) usage("a producer name is required");
  if (a.batch_size < 1 || a.epochs < 1) usage("--batch-size and --epochs must be >= 1");
  return a;
}

struct Epoch {
  int64_t epoch = 0;
  int64_t batches = 0;
  int64_t samples = 0;
  double loss = 0.0;  // mean over the epoch's samples
  bool exactly_once = false;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  torch::manual_seed(0);
  torch::set_num_threads(1);

  batchcast::ConsumerOptions options;
  options.name = args.name;
  options.batch_size = args.batch_size;  // this trainer's own batch size
  options.timeout = args.timeout;
  // Joining mid-epoch: start with the next batch, epochs of its own from
  // there (each every sample once); without it, at the producer's next epoch.
  options.join_now = args.join_now;
  options.reporter = [](const batchcast::Report& r) {
    if (r.level == batchcast::Report::Level::Warning) std::cerr << "batchcast: " << r.message << "\n";
  };

  std::vector<Epoch> epochs;
  int64_t joined_at = 0;
  int64_t batches_per_epoch = -1;
  try {
    batchcast::Consumer consumer(options);  // waits up to --timeout for the producer
    batches_per_epoch = consumer.batches_per_epoch();  // len(): -1 while the producer cannot say

    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(args.lr));

    for (int e = 0; e < args.epochs; ++e) {
      Epoch stats;
      stats.epoch = consumer.begin_epoch();
      std::vector<int> seen;
      double loss_sum = 0.0;
      while (std::optional<batchcast::Batch> batch = consumer.next()) {
        // Leaves in the order the producer's batch structure lists them;
        // they are read-only views of shared memory: use, never modify in place.
        const at::Tensor x = batchcast::to_aten(std::get<batchcast::Tensor>(batch->leaves.at(0)));
        const at::Tensor y = batchcast::to_aten(std::get<batchcast::Tensor>(batch->leaves.at(1)));
        const at::Tensor index = batchcast::to_aten(std::get<batchcast::Tensor>(batch->leaves.at(2)));

        optimizer.zero_grad();
        torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        loss.backward();
        optimizer.step();

        loss_sum += loss.item<double>() * static_cast<double>(x.size(0));
        stats.batches += 1;
        stats.samples += x.size(0);
        auto ids = index.accessor<int64_t, 1>();
        for (int64_t i = 0; i < ids.size(0); ++i) {
          const int64_t id = ids[i];
          if (id < 0) continue;
          if (static_cast<size_t>(id) >= seen.size()) seen.resize(static_cast<size_t>(id) + 1, 0);
          seen[static_cast<size_t>(id)] += 1;
        }
      }
      if (stats.samples == 0) {
        if (consumer.finished()) break;  // the producer served fewer epochs
        continue;
      }
      stats.loss = loss_sum / static_cast<double>(stats.samples);
      stats.exactly_once = static_cast<int64_t>(seen.size()) == stats.samples;
      for (int count : seen) stats.exactly_once = stats.exactly_once && count == 1;
      std::printf("epoch %lld: %lld batches, %lld samples, mean loss %.4f, every sample exactly once: %s\n",
                  static_cast<long long>(stats.epoch), static_cast<long long>(stats.batches),
                  static_cast<long long>(stats.samples), stats.loss, stats.exactly_once ? "yes" : "no");
      std::fflush(stdout);
      epochs.push_back(stats);
    }
    const batchcast::ConsumerStats s = consumer.stats();
    joined_at = s.joined_at;
    std::printf("consumer: %lld batches as %lld views and %lld copies\n",
                static_cast<long long>(s.batches), static_cast<long long>(s.views),
                static_cast<long long>(s.copies));
    consumer.close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_train: %s\n", e.what());
    return 1;
  }

  if (!args.report.empty()) {
    std::ofstream out(args.report);
    out << "{\"batch_size\": " << args.batch_size << ", \"joined_at\": " << joined_at
        << ", \"batches_per_epoch\": " << batches_per_epoch << ", \"epochs\": [";
    for (size_t i = 0; i < epochs.size(); ++i) {
      const Epoch& s = epochs[i];
      out << (i ? ", " : "") << "{\"epoch\": " << s.epoch << ", \"batches\": " << s.batches
          << ", \"samples\": " << s.samples << ", \"loss\": " << s.loss
          << ", \"exactly_once\": " << (s.exactly_once ? "true" : "false") << "}";
    }
    out << "]}\n";
  }
  bool ok = !epochs.empty();
  for (const Epoch& s : epochs) ok = ok && s.exactly_once;
  return ok ? 0 : 1;
}
