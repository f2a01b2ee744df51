// One row per engine option (a field of EngineOptions): its key, kind, range and a line of doc,
// with how to set it from text, show it as text and read it as a number. The engine's own
// options are declared in src/api/option_table.cc, each backend's in its folder
// (Backend::Options). Everything that reads, checks or shows options iterates the rows:
// SetOption and DescribeOptions (the Python binding, xfer-bench --set, xfer-info), and
// Initialize's range checks.
//
// A row is made by one of the XFER_OPTION_* macros below, from the field's path:
//   XFER_OPTION_COUNT("streams", streams, 1, 256, "worker threads that run a request's batches")
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xfer/options.h"
#include "xfer/status.h"

namespace xfer::options {

struct Row {
  std::string_view key;  // the field's path: "tcp.links"
  OptionKind kind = OptionKind::kText;
  std::string_view doc;  // one line
  // Numbers (kCount, kBytes; kDuration in the field's unit): the range Initialize checks
  // (lo > hi: any value); zero_ok: 0 too, besides the range (0 meaning off, or a default).
  int64_t lo = 1, hi = 0;
  bool zero_ok = false;
  std::string_view unit;     // kDuration: "us" or "ms"
  std::string_view choices;  // kChoice: "auto, on, off"
  Status (*set)(EngineOptions&, std::string_view text) = nullptr;
  std::string (*show)(const EngineOptions&) = nullptr;
  int64_t (*number)(const EngineOptions&) = nullptr;  // numbers only
  // What Initialize checks beyond the range (against other fields, or the text's form).
  Status (*check)(const EngineOptions&) = nullptr;
};

// Text forms. A number shows as it parses back: "4 MiB", "500 ms", "16 M" (2^20) where exact.
bool ParseBool(std::string_view text, bool* out);
bool ParseCount(std::string_view text, int64_t* out);  // digits, optionally with K, M, G (2^10..)
bool ParseBytes(std::string_view text, int64_t* out);  // the same, KiB, MiB, GiB, or B
// A time in the given unit ("us", "ms"): a number with us, ms or s (rounded to the nearest
// unit, and at least one unit when above 0), or a bare number in that unit.
bool ParseDuration(std::string_view text, std::string_view unit, int64_t* out);
std::string ShowCount(int64_t v);
std::string ShowBytes(int64_t v);
std::string ShowDuration(int64_t v, std::string_view unit);
std::string ShowNumber(const Row& row, int64_t v);
// "1..256", "0, or 4 KiB..1 GiB", "auto, on, off"; "" for a row with no range.
std::string RangeOf(const Row& row);
// kInvalidArgument: "<key>: '<text>' is not <what>".
Status NotA(std::string_view key, std::string_view text, std::string_view what);

// Sets an integer field from a number, if the field's type holds it.
template <class T>
Status SetInteger(T* field, int64_t v, std::string_view key, std::string_view text) {
  if constexpr (std::is_unsigned_v<T>) {
    if (v < 0 || static_cast<uint64_t>(v) > std::numeric_limits<T>::max()) return NotA(key, text, "in range");
  } else {
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
      return NotA(key, text, "in range");
  }
  *field = static_cast<T>(v);
  return Status::Ok();
}
template <class T>
Status SetCount(T* field, std::string_view text, std::string_view key) {
  int64_t v = 0;
  if (!ParseCount(text, &v)) return NotA(key, text, "a whole number");
  return SetInteger(field, v, key, text);
}
template <class T>
Status SetBytes(T* field, std::string_view text, std::string_view key) {
  int64_t v = 0;
  if (!ParseBytes(text, &v)) return NotA(key, text, "a size (4096, 64K, 4 MiB)");
  return SetInteger(field, v, key, text);
}
template <class Rep, class Period>
Status SetDuration(std::chrono::duration<Rep, Period>* field, std::string_view text, std::string_view key,
                   std::string_view unit) {
  int64_t v = 0;
  if (!ParseDuration(text, unit, &v)) return NotA(key, text, "a time (500ms, 3s, 50us)");
  *field = std::chrono::duration<Rep, Period>(v);
  return Status::Ok();
}
inline Status SetBool(bool* field, std::string_view text, std::string_view key) {
  return ParseBool(text, field) ? Status::Ok() : NotA(key, text, "true or false");
}
// A list shown as it parses back (xfer::SplitList): its items, comma-separated.
std::string JoinList(const std::vector<std::string>& items);
template <class E>
Status SetChoice(E* field, std::string_view text, std::string_view key, std::string_view choices,
                 bool (*parse)(std::string_view, E*)) {
  if (parse(text, field)) return Status::Ok();
  return {StatusCode::kInvalidArgument,
          std::string(key) + " must be one of " + std::string(choices) + ", not '" + std::string(text) + "'"};
}

using SetFn = Status (*)(EngineOptions&, std::string_view);
using ShowFn = std::string (*)(const EngineOptions&);
using NumberFn = int64_t (*)(const EngineOptions&);
// A row (the macros below make them): its kind's functions, then its range, unit or choices.
inline Row MakeRow(std::string_view key, OptionKind kind, std::string_view doc, SetFn set, ShowFn show,
                   NumberFn number = nullptr) {
  Row r;
  r.key = key;
  r.kind = kind;
  r.doc = doc;
  r.set = set;
  r.show = show;
  r.number = number;
  return r;
}
inline Row Ranged(Row r, int64_t lo, int64_t hi, bool zero_ok = false, std::string_view unit = {}) {
  r.lo = lo;
  r.hi = hi;
  r.zero_ok = zero_ok;
  r.unit = unit;
  return r;
}
inline Row WithChoices(Row r, std::string_view choices) {
  r.choices = choices;
  return r;
}

}  // namespace xfer::options

// The rows' makers: KEY is the option's name, FIELD its path in EngineOptions (o.FIELD).
#define XFER_OPTION_NUMBER_(key_, kind_, field, lo_, hi_, zero_ok_, doc_, setter, shower)         \
  ::xfer::options::Ranged(                                                                        \
      ::xfer::options::MakeRow(                                                                   \
          key_, kind_, doc_,                                                                      \
          [](::xfer::EngineOptions& o, std::string_view t) { return setter(&o.field, t, key_); }, \
          [](const ::xfer::EngineOptions& o) { return shower(static_cast<int64_t>(o.field)); },   \
          [](const ::xfer::EngineOptions& o) { return static_cast<int64_t>(o.field); }),          \
      lo_, hi_, zero_ok_)
#define XFER_OPTION_COUNT(key, field, lo, hi, doc)                                                           \
  XFER_OPTION_NUMBER_(key, ::xfer::OptionKind::kCount, field, lo, hi, false, doc, ::xfer::options::SetCount, \
                      ::xfer::options::ShowCount)
#define XFER_OPTION_BYTES(key, field, lo, hi, doc)                                                           \
  XFER_OPTION_NUMBER_(key, ::xfer::OptionKind::kBytes, field, lo, hi, false, doc, ::xfer::options::SetBytes, \
                      ::xfer::options::ShowBytes)
// Bytes, or 0 (off, or "the default": the doc says which).
#define XFER_OPTION_BYTES_OR_0(key, field, lo, hi, doc)                                                     \
  XFER_OPTION_NUMBER_(key, ::xfer::OptionKind::kBytes, field, lo, hi, true, doc, ::xfer::options::SetBytes, \
                      ::xfer::options::ShowBytes)
// A std::chrono duration field; unit: its own ("ms", "us").
#define XFER_OPTION_DURATION(key_, field, unit_, lo_, hi_, doc_)                                 \
  ::xfer::options::Ranged(                                                                       \
      ::xfer::options::MakeRow(                                                                  \
          key_, ::xfer::OptionKind::kDuration, doc_,                                             \
          [](::xfer::EngineOptions& o, std::string_view t) {                                     \
            return ::xfer::options::SetDuration(&o.field, t, key_, unit_);                       \
          },                                                                                     \
          [](const ::xfer::EngineOptions& o) {                                                   \
            return ::xfer::options::ShowDuration(static_cast<int64_t>(o.field.count()), unit_);  \
          },                                                                                     \
          [](const ::xfer::EngineOptions& o) { return static_cast<int64_t>(o.field.count()); }), \
      lo_, hi_, false, unit_)
#define XFER_OPTION_BOOL(key_, field, doc_)                 \
  ::xfer::options::MakeRow(                                 \
      key_, ::xfer::OptionKind::kBool, doc_,                \
      [](::xfer::EngineOptions& o, std::string_view t) {    \
        return ::xfer::options::SetBool(&o.field, t, key_); \
      },                                                    \
      [](const ::xfer::EngineOptions& o) { return std::string(o.field ? "true" : "false"); })
// A string field, shown as it is (TEXT) or only as set or not (SECRET).
#define XFER_OPTION_STRING_(key_, field, kind_, doc_, shower) \
  ::xfer::options::MakeRow(                                   \
      key_, kind_, doc_,                                      \
      [](::xfer::EngineOptions& o, std::string_view t) {      \
        o.field = std::string(t);                             \
        return ::xfer::Status::Ok();                          \
      },                                                      \
      shower)
#define XFER_OPTION_TEXT(key_, field, doc_)                         \
  XFER_OPTION_STRING_(key_, field, ::xfer::OptionKind::kText, doc_, \
                      [](const ::xfer::EngineOptions& o) { return o.field; })
#define XFER_OPTION_SECRET(key_, field, doc_)                                                              \
  XFER_OPTION_STRING_(key_, field, ::xfer::OptionKind::kSecret, doc_, [](const ::xfer::EngineOptions& o) { \
    return std::string(o.field.empty() ? "" : "(set)");                                                    \
  })
#define XFER_OPTION_LIST(key_, field, doc_)              \
  ::xfer::options::MakeRow(                              \
      key_, ::xfer::OptionKind::kList, doc_,             \
      [](::xfer::EngineOptions& o, std::string_view t) { \
        o.field = ::xfer::SplitList(t);                  \
        return ::xfer::Status::Ok();                     \
      },                                                 \
      [](const ::xfer::EngineOptions& o) { return ::xfer::options::JoinList(o.field); })
// An enum field; parse and name: its text functions (ParseStaging, StagingName); choices: the
// names, ", "-separated.
#define XFER_OPTION_CHOICE(key_, field, parse, name, choices_, doc_)                  \
  ::xfer::options::WithChoices(                                                       \
      ::xfer::options::MakeRow(                                                       \
          key_, ::xfer::OptionKind::kChoice, doc_,                                    \
          [](::xfer::EngineOptions& o, std::string_view t) {                          \
            return ::xfer::options::SetChoice(&o.field, t, key_, choices_, parse);    \
          },                                                                          \
          [](const ::xfer::EngineOptions& o) { return std::string(name(o.field)); }), \
      choices_)
