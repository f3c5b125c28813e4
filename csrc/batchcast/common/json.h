// A small JSON writer for status reports (numbers, strings, booleans, nested
// objects and arrays). Text for people and tools; never parsed by the core.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace batchcast {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  JsonWriter& key(const std::string& k) {
    comma();
    string(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }

  template <typename T>
  JsonWriter& value(const T& v) {
    comma();
    if constexpr (std::is_same_v<T, bool>) {
      out_ += v ? "true" : "false";
    } else if constexpr (std::is_integral_v<T>) {
      out_ += std::to_string(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!std::isfinite(v)) {
        out_ += "null";
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.6g", static_cast<double>(v));
        out_ += buf;
      }
    } else {
      string(std::string(v));
    }
    return *this;
  }

  template <typename T>
  JsonWriter& field(const std::string& k, const T& v) {
    return key(k).value(v);
  }

  const std::string& str() const { return out_; }

 private:
  JsonWriter& open(char c) {
    comma();
    out_ += c;
    first_ = true;
    return *this;
  }
  JsonWriter& close(char c) {
    out_ += c;
    first_ = false;
    return *this;
  }
  // A separator before every element but the first of a container, and not
  // between a key and its value.
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_) out_ += ',';
    first_ = false;
  }
  void string(const std::string& s) {
    out_ += '"';
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += static_cast<char>(c);
      } else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out_ += buf;
      } else {
        out_ += static_cast<char>(c);
      }
    }
    out_ += '"';
  }

  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace batchcast
