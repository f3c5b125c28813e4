// Options and statistics are declared once: a list macro names each field as
// X(type, name, default), and the struct's members and its visit() — from
// which the Python binding takes its keywords, defaults and type checks, its
// stub is checked, and statistics become dicts and JSON — are made from that
// list. Adding an option or a statistic is a line in its list and the code
// that uses it.
//
//   #define BATCHCAST_THING_FIELDS(X) X(int64_t, slots, 8) X(std::string, name, "")
//   struct Thing {
//     BATCHCAST_FIELDS(BATCHCAST_THING_FIELDS)
//     BATCHCAST_VISIT(BATCHCAST_THING_FIELDS)
//   };
//
// (Comments inside a list are /* */: a // comment would swallow the line
// continuation.)
#pragma once

#define BATCHCAST_FIELD_MEMBER(type, name, init) type name = init;
#define BATCHCAST_FIELD_VISIT(type, name, init) v(#name, name);

// The members, with their defaults.
#define BATCHCAST_FIELDS(LIST) LIST(BATCHCAST_FIELD_MEMBER)

// visit(v): v("name", field) for every field of the list, in its order, on a
// const or a mutable struct.
#define BATCHCAST_VISIT(LIST)                   \
  template <typename Visit>                     \
  void visit(Visit&& v) {                       \
    LIST(BATCHCAST_FIELD_VISIT)                 \
  }                                             \
  template <typename Visit>                     \
  void visit(Visit&& v) const {                 \
    LIST(BATCHCAST_FIELD_VISIT)                 \
  }
