#include "util/option_rows.h"

#include <cctype>
#include <charconv>
#include <cstdlib>

namespace xfer::options {
namespace {

std::string_view Trim(std::string_view t) {
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  return t;
}

// A number and what follows it, trimmed. Whole numbers are read exactly (*whole, *exact);
// others (a fraction, an exponent: "1.5", "5e-05") as a double.
struct Number {
  bool exact = false;
  int64_t whole = 0;
  double value = 0;
};
bool SplitNumber(std::string_view text, Number* number, std::string_view* suffix) {
  text = Trim(text);
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-' ||
                        text[0] == '+' || text[0] == '.')) {
    return false;  // (no "inf", "nan" or hex: strtod reads those)
  }
  const std::string all(text);
  char* end = nullptr;
  number->value = std::strtod(all.c_str(), &end);
  const size_t n = static_cast<size_t>(end - all.c_str());
  if (n == 0 || !std::isfinite(number->value)) return false;
  const std::string_view digits = text.substr(text[0] == '+' ? 1 : 0, n - (text[0] == '+' ? 1 : 0));
  const auto [at, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number->whole);
  number->exact = ec == std::errc() && at == digits.data() + digits.size();
  if (!number->exact && ec == std::errc::result_out_of_range) return false;  // (a whole number too large)
  *suffix = Trim(text.substr(n));
  return true;
}

// *out = number * scale, when it is a whole number that fits.
bool Scaled(const Number& number, int64_t scale, int64_t* out) {
  if (number.exact) return !__builtin_mul_overflow(number.whole, scale, out);
  const double v = number.value * static_cast<double>(scale);
  if (v != std::floor(v) || v < -9.2e18 || v > 9.2e18) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

bool Lower(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  }
  return true;
}

// 2^10 steps: "" 1, "k"/"kib" 2^10, "m"/"mib" 2^20, "g"/"gib" 2^30 (and "b" after them).
bool BinaryScale(std::string_view suffix, bool bytes, int64_t* scale) {
  if (bytes && (Lower(suffix, "b") || suffix.empty())) return *scale = 1, true;
  if (suffix.empty()) return *scale = 1, true;
  const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(suffix[0])));
  const int64_t step = c == 'k' ? 1ll << 10 : c == 'm' ? 1ll << 20 : c == 'g' ? 1ll << 30 : 0;
  if (step == 0) return false;
  const std::string_view rest = suffix.substr(1);
  if (rest.empty() || (bytes && (Lower(rest, "ib") || Lower(rest, "b")))) return *scale = step, true;
  return false;
}

std::string ShowBinary(int64_t v, const char* const units[4]) {
  int u = 0;
  while (u < 3 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + units[u];
}

}  // namespace

bool ParseBool(std::string_view text, bool* out) {
  text = Trim(text);
  for (std::string_view t : {"true", "on", "yes", "1"}) {
    if (Lower(text, t)) return *out = true, true;
  }
  for (std::string_view f : {"false", "off", "no", "0"}) {
    if (Lower(text, f)) return *out = false, true;
  }
  return false;
}

bool ParseCount(std::string_view text, int64_t* out) {
  Number n;
  int64_t scale = 1;
  std::string_view suffix;
  return SplitNumber(text, &n, &suffix) && BinaryScale(suffix, false, &scale) && Scaled(n, scale, out);
}

bool ParseBytes(std::string_view text, int64_t* out) {
  Number n;
  int64_t scale = 1;
  std::string_view suffix;
  return SplitNumber(text, &n, &suffix) && BinaryScale(suffix, true, &scale) && Scaled(n, scale, out);
}

bool ParseDuration(std::string_view text, std::string_view unit, int64_t* out) {
  Number n;
  std::string_view suffix;
  if (!SplitNumber(text, &n, &suffix)) return false;
  const double per_second = unit == "us" ? 1e6 : 1e3;  // the field's units in a second
  double seconds = 0;
  if (suffix.empty()) {
    if (n.exact) return *out = n.whole, true;
    seconds = n.value / per_second;
  } else if (Lower(suffix, "s")) {
    seconds = n.value;
  } else if (Lower(suffix, "ms")) {
    seconds = n.value / 1e3;
  } else if (Lower(suffix, "us") || suffix == "\u00b5s") {
    seconds = n.value / 1e6;
  } else {
    return false;
  }
  // To the nearest unit; a time above 0 is at least one (a timeout of 100 us in ms: 1 ms, not 0).
  double v = std::round(seconds * per_second);
  if (seconds > 0 && v == 0) v = 1;
  if (v < -9.2e18 || v > 9.2e18) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

std::string ShowCount(int64_t v) {
  if (v >= (1 << 20) && v % (1 << 20) == 0) return std::to_string(v >> 20) + " M";
  return std::to_string(v);
}

std::string ShowBytes(int64_t v) {
  static const char* const kUnits[4] = {"", " KiB", " MiB", " GiB"};
  return ShowBinary(v, kUnits);
}

std::string ShowDuration(int64_t v, std::string_view unit) {
  const int64_t per_ms = unit == "us" ? 1000 : 1;
  if (v != 0 && v % (per_ms * 1000) == 0) return std::to_string(v / (per_ms * 1000)) + " s";
  if (v != 0 && v % per_ms == 0) return std::to_string(v / per_ms) + " ms";
  return std::to_string(v) + " " + std::string(unit);
}

std::string ShowNumber(const Row& row, int64_t v) {
  switch (row.kind) {
    case OptionKind::kBytes:
      return ShowBytes(v);
    case OptionKind::kDuration:
      return ShowDuration(v, row.unit);
    default:
      return ShowCount(v);
  }
}

std::string RangeOf(const Row& row) {
  if (row.kind == OptionKind::kChoice) return std::string(row.choices);
  if (row.lo > row.hi) return "";
  std::string range = ShowNumber(row, row.lo);
  range += row.hi == std::numeric_limits<int64_t>::max() ? " or more" : ".." + ShowNumber(row, row.hi);
  return row.zero_ok ? "0, or " + range : range;
}

Status NotA(std::string_view key, std::string_view text, std::string_view what) {
  return {StatusCode::kInvalidArgument,
          std::string(key) + ": '" + std::string(text) + "' is not " + std::string(what)};
}

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

}  // namespace xfer::options
