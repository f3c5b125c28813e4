#include "batchcast/consumer/layout.h"

#include <cstdint>
#include <vector>

namespace batchcast::layout {
namespace {

// A JSON value as far as a layout needs: arrays, strings (decoded) and any
// other scalar as its text (numbers, true, false, null).
struct Node {
  enum class Kind { Array, String, Scalar } kind = Kind::Scalar;
  std::string text;
  std::vector<Node> items;
  bool same_value(const Node& o) const { return kind == o.kind && text == o.text && items.empty() && o.items.empty(); }
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  // nullopt for anything that is not one JSON value of the kinds above.
  std::optional<Node> read() {
    Node n;
    if (!value(n, 0)) return std::nullopt;
    space();
    if (at_ != s_.size()) return std::nullopt;
    return n;
  }

 private:
  static constexpr int kMaxDepth = 128;  // a layout nests as deep as the user's batch

  void space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\t' || s_[at_] == '\r')) ++at_;
  }
  bool value(Node& n, int depth) {
    if (depth > kMaxDepth) return false;
    space();
    if (at_ >= s_.size()) return false;
    const char c = s_[at_];
    if (c == '[') {
      n.kind = Node::Kind::Array;
      ++at_;
      space();
      if (at_ < s_.size() && s_[at_] == ']') {
        ++at_;
        return true;
      }
      while (true) {
        n.items.emplace_back();
        if (!value(n.items.back(), depth + 1)) return false;
        space();
        if (at_ >= s_.size()) return false;
        if (s_[at_] == ',') {
          ++at_;
          continue;
        }
        if (s_[at_] != ']') return false;
        ++at_;
        return true;
      }
    }
    if (c == '"') return string(n);
    // A number or a literal: its text up to the next delimiter.
    const std::size_t from = at_;
    while (at_ < s_.size() && s_[at_] != ',' && s_[at_] != ']' && s_[at_] != ' ') ++at_;
    if (at_ == from) return false;
    n.kind = Node::Kind::Scalar;
    n.text = s_.substr(from, at_ - from);
    return true;
  }
  bool string(Node& n) {
    n.kind = Node::Kind::String;
    ++at_;  // the opening quote
    while (at_ < s_.size()) {
      const char c = s_[at_++];
      if (c == '"') return true;
      if (c != '\\') {
        n.text += c;
        continue;
      }
      if (at_ >= s_.size()) return false;
      const char e = s_[at_++];
      switch (e) {
        case 'n': n.text += '\n'; break;
        case 't': n.text += '\t'; break;
        case 'r': n.text += '\r'; break;
        case 'b': n.text += '\b'; break;
        case 'f': n.text += '\f'; break;
        case 'u':  // shown as written: a name for people, not compared to anything else
          if (at_ + 4 > s_.size()) return false;
          n.text += "\\u" + s_.substr(at_, 4);
          at_ += 4;
          break;
        default: n.text += e;  // " \ /
      }
    }
    return false;
  }

  const std::string& s_;
  std::size_t at_ = 0;
};

// Python's way of writing a value of the layout (a key, a scalar).
std::string shown(const Node& n) {
  if (n.kind == Node::Kind::String) {
    std::string out = "'";
    for (char c : n.text) {
      if (c == '\'' || c == '\\') out += '\\';
      out += c;
    }
    return out + "'";
  }
  if (n.kind == Node::Kind::Array) return "[...]";
  if (n.text == "true") return "True";
  if (n.text == "false") return "False";
  if (n.text == "null") return "None";
  return n.text;
}

std::string shown_list(const Node& n) {
  std::string out = "[";
  for (std::size_t i = 0; i < n.items.size(); ++i) out += (i ? ", " : "") + shown(n.items[i]);
  return out + "]";
}

// The node's tag ("T", "d", ...) when it is a well-formed layout node.
std::string tag_of(const Node& n) {
  if (n.kind != Node::Kind::Array || n.items.empty() || n.items[0].kind != Node::Kind::String) return "";
  const std::string& t = n.items[0].text;
  const std::size_t want = t == "T" || t == "v" ? 2
                           : t == "S" || t == "z" || t == "d" ? 3
                           : t == "t" || t == "l" ? 2
                           : t == "n" ? 5
                                      : 0;
  if (want == 0 || n.items.size() != want) return "";
  if ((t == "d" && (n.items[1].kind != Node::Kind::Array || n.items[2].kind != Node::Kind::Array ||
                    n.items[1].items.size() != n.items[2].items.size())) ||
      ((t == "t" || t == "l") && n.items[1].kind != Node::Kind::Array) ||
      (t == "n" && (n.items[3].kind != Node::Kind::Array || n.items[4].kind != Node::Kind::Array ||
                    n.items[3].items.size() != n.items[4].items.size()))) {
    return "";
  }
  return t;
}

std::string items_text(std::size_t n) { return std::to_string(n) + (n == 1 ? " item" : " items"); }

std::string namedtuple_text(const Node& n) {
  std::string out = "namedtuple " + n.items[2].text + "(";
  for (std::size_t i = 0; i < n.items[3].items.size(); ++i) out += (i ? ", " : "") + n.items[3].items[i].text;
  return out + ")";
}

std::string describe(const Node& n) {
  const std::string t = tag_of(n);
  if (t == "T") return "a tensor";
  if (t == "S") return n.items[2].text == "true" ? "a per-sample tuple" : "a per-sample list";
  if (t == "v") return "the value " + shown(n.items[1]);
  if (t == "z") return "a 0-d tensor holding " + shown(n.items[1]) + " (" + n.items[2].text + ")";
  if (t == "d") return "a dict with keys " + shown_list(n.items[1]);
  if (t == "t") return "a tuple of " + items_text(n.items[1].items.size());
  if (t == "l") return "a list of " + items_text(n.items[1].items.size());
  if (t == "n") return "a " + namedtuple_text(n);
  return "something unreadable";
}

std::string key_path(const std::string& path, const Node& key) { return path + "[" + shown(key) + "]"; }

std::optional<std::string> diff(const Node& a, const Node& b, const std::string& path) {
  const std::string ta = tag_of(a);
  const std::string tb = tag_of(b);
  auto at = [&](const std::string& what) { return std::optional<std::string>("at " + path + ": " + what); };
  if (ta.empty() || tb.empty() || ta != tb) return at(describe(a) + " became " + describe(b));
  if (ta == "T" || ta == "S") {
    if (ta == "S" && !a.items[2].same_value(b.items[2])) return at(describe(a) + " became " + describe(b));
    if (!a.items[1].same_value(b.items[1])) return at("its leaves are in another order");
    return std::nullopt;
  }
  if (ta == "v") {
    if (a.items[1].same_value(b.items[1])) return std::nullopt;
    return at("the value " + shown(a.items[1]) + " became " + shown(b.items[1]) +
              " (a value beside the samples, not one per sample)");
  }
  if (ta == "z") {
    if (a.items[1].same_value(b.items[1]) && a.items[2].same_value(b.items[2])) return std::nullopt;
    return at(describe(a) + " became one holding " + shown(b.items[1]) + " (" + b.items[2].text +
              ") (a 0-d tensor is one value beside the samples, not one per sample)");
  }
  if (ta == "d") {
    const auto& ka = a.items[1].items;
    const auto& kb = b.items[1].items;
    bool same = ka.size() == kb.size();
    for (std::size_t i = 0; same && i < ka.size(); ++i) same = ka[i].same_value(kb[i]);
    if (!same) return at("the dict's keys " + shown_list(a.items[1]) + " became " + shown_list(b.items[1]));
    for (std::size_t i = 0; i < ka.size(); ++i) {
      if (auto d = diff(a.items[2].items[i], b.items[2].items[i], key_path(path, ka[i]))) return d;
    }
    return std::nullopt;
  }
  if (ta == "t" || ta == "l") {
    const auto& ca = a.items[1].items;
    const auto& cb = b.items[1].items;
    if (ca.size() != cb.size()) return at(describe(a) + " became " + describe(b));
    for (std::size_t i = 0; i < ca.size(); ++i) {
      if (auto d = diff(ca[i], cb[i], path + "[" + std::to_string(i) + "]")) return d;
    }
    return std::nullopt;
  }
  // A namedtuple: its class (module, name, fields), then its fields' values.
  bool same = a.items[1].same_value(b.items[1]) && a.items[2].same_value(b.items[2]) &&
              a.items[3].items.size() == b.items[3].items.size();
  for (std::size_t i = 0; same && i < a.items[3].items.size(); ++i) {
    same = a.items[3].items[i].same_value(b.items[3].items[i]);
  }
  if (!same) return at(describe(a) + " became " + describe(b));
  for (std::size_t i = 0; i < a.items[4].items.size(); ++i) {
    if (auto d = diff(a.items[4].items[i], b.items[4].items[i], path + "." + a.items[3].items[i].text)) return d;
  }
  return std::nullopt;
}

bool find_leaf(const Node& n, const std::string& index, const std::string& path, std::string& out) {
  const std::string t = tag_of(n);
  if (t == "T" || t == "S") {
    if (n.items[1].text != index) return false;
    out = path;
    return true;
  }
  if (t == "d") {
    for (std::size_t i = 0; i < n.items[1].items.size(); ++i) {
      if (find_leaf(n.items[2].items[i], index, key_path(path, n.items[1].items[i]), out)) return true;
    }
  } else if (t == "t" || t == "l") {
    for (std::size_t i = 0; i < n.items[1].items.size(); ++i) {
      if (find_leaf(n.items[1].items[i], index, path + "[" + std::to_string(i) + "]", out)) return true;
    }
  } else if (t == "n") {
    for (std::size_t i = 0; i < n.items[4].items.size(); ++i) {
      if (find_leaf(n.items[4].items[i], index, path + "." + n.items[3].items[i].text, out)) return true;
    }
  }
  return false;
}

// The keys to leaf `index` under n, each as its text and as Python shows it.
bool find_keys(const Node& n, const std::string& index, std::vector<std::pair<std::string, std::string>>& keys) {
  const std::string t = tag_of(n);
  if (t == "T" || t == "S") return n.items[1].text == index;
  auto below = [&](const Node& child, std::string text, std::string python) {
    keys.emplace_back(std::move(text), std::move(python));
    if (find_keys(child, index, keys)) return true;
    keys.pop_back();
    return false;
  };
  if (t == "d") {
    for (std::size_t i = 0; i < n.items[1].items.size(); ++i) {
      const Node& key = n.items[1].items[i];
      if (below(n.items[2].items[i], key.text, shown(key))) return true;
    }
  } else if (t == "t" || t == "l") {
    for (std::size_t i = 0; i < n.items[1].items.size(); ++i) {
      if (below(n.items[1].items[i], std::to_string(i), std::to_string(i))) return true;
    }
  } else if (t == "n") {
    for (std::size_t i = 0; i < n.items[4].items.size(); ++i) {
      const std::string& field = n.items[3].items[i].text;
      if (below(n.items[4].items[i], field, shown(n.items[3].items[i]))) return true;
    }
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> keys_of(const std::string& layout, std::size_t index) {
  std::vector<std::pair<std::string, std::string>> keys;
  auto tree = Reader(layout).read();
  if (!tree || !find_keys(*tree, std::to_string(index), keys)) keys.clear();
  return keys;
}

std::string clipped(const std::string& s) { return s.size() <= 200 ? s : s.substr(0, 200) + "..."; }

}  // namespace

std::optional<std::string> describe_change(const std::string& before, const std::string& after) {
  if (before == after) return std::nullopt;
  auto a = Reader(before).read();
  auto b = Reader(after).read();
  if (!a || !b) return "its structure description changed from " + clipped(before) + " to " + clipped(after);
  return diff(*a, *b, "batch");
}

std::vector<std::string> leaf_keys(const std::string& layout, std::size_t index) {
  std::vector<std::string> out;
  for (auto& [text, python] : keys_of(layout, index)) out.push_back(text);
  return out;
}

std::string leaf_key(const std::string& layout, std::size_t index) {
  const auto keys = keys_of(layout, index);
  if (keys.size() == 1) return keys[0].second;
  std::string out = "(";
  for (std::size_t i = 0; i < keys.size(); ++i) out += (i ? ", " : "") + keys[i].second;
  return out + (keys.size() == 1 ? ",)" : ")");
}

std::string leaf_path(const std::string& layout, std::size_t index) {
  std::string path;
  if (auto tree = Reader(layout).read()) {
    if (find_leaf(*tree, std::to_string(index), "batch", path)) return path;
  }
  return "leaf " + std::to_string(index);
}

}  // namespace batchcast::layout
