#include "batchcast/consumer/lifecycle.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace batchcast {

Lifecycle::Lifecycle(bool grouping) : state_(grouping ? State{Grouping{}} : State{Between{}}) {}

const char* Lifecycle::name(const State& state) {
  static constexpr const char* kNames[] = {"grouping", "between epochs", "in an epoch", "ended", "broken", "closed"};
  return kNames[state.index()];
}

void Lifecycle::refuse(const char* event) const {
  throw std::logic_error(std::string("consumer lifecycle: ") + event + " while " + name(state_));
}

bool Lifecycle::arrived() const {
  const auto* e = std::get_if<InEpoch>(&state_);
  return e != nullptr && e->arrived;
}

bool Lifecycle::finished() const {
  return std::holds_alternative<Ended>(state_) || std::holds_alternative<Closed>(state_);
}

void Lifecycle::group_ready() {
  if (!grouping()) refuse("its group became ready");
  state_ = Between{};
}

void Lifecycle::begin(bool stream_end_known) {
  std::visit(
      [&](auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, Between>) {
          state_ = InEpoch{};
        } else if constexpr (std::is_same_v<S, Ended>) {
          state_ = Ended{true};  // every later epoch is past the stream's end
        } else if constexpr (std::is_same_v<S, Closed>) {
          if (stream_end_known) state_ = Ended{true};
        } else if constexpr (std::is_same_v<S, InEpoch>) {
          refuse("an epoch began (the one under way is drained first)");
        } else if constexpr (std::is_same_v<S, Grouping>) {
          refuse("an epoch began (its group is awaited first)");
        } else {
          static_assert(std::is_same_v<S, Broken>, "every state is handled");
          refuse("an epoch began (a broken group raises first)");
        }
      },
      state_);
}

void Lifecycle::batch_arrived() {
  auto* e = std::get_if<InEpoch>(&state_);
  if (e == nullptr) refuse("a batch of the epoch arrived");
  e->arrived = true;
}

void Lifecycle::epoch_ended() {
  if (!in_epoch()) refuse("the epoch ended");
  state_ = Between{};
}

void Lifecycle::loader_failed(protocol::LoaderFailed failed) {
  if (in_epoch() || std::holds_alternative<Between>(state_)) {
    state_ = Between{};
  } else if (!grouping()) {
    refuse("the loader failed");
  }
  failed_ = std::move(failed);
}

void Lifecycle::stream_ended(bool started, protocol::Finished end) {
  if (std::holds_alternative<Ended>(state_)) return;  // said once
  if (std::holds_alternative<Broken>(state_) || std::holds_alternative<Closed>(state_)) {
    refuse("the producer's stream ended");
  }
  state_ = Ended{!(in_epoch() && started)};
  end_ = std::move(end);
}

void Lifecycle::broke(std::exception_ptr error) { state_ = Broken{std::move(error)}; }

void Lifecycle::close() {
  if (std::holds_alternative<Ended>(state_) || std::holds_alternative<Broken>(state_)) return;
  state_ = Closed{};
}

}  // namespace batchcast
