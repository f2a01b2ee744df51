#include "xfer/status.h"
#include "util/text.h"
#include "xfer/options.h"
#include "xfer/types.h"

namespace xfer {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kTimeout:
      return "TIMEOUT";
    case StatusCode::kNotConnected:
      return "NOT_CONNECTED";
    case StatusCode::kAlreadyConnected:
      return "ALREADY_CONNECTED";
    case StatusCode::kUnsupported:
      return "UNSUPPORTED";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kRemoteAccessDenied:
      return "REMOTE_ACCESS_DENIED";
    case StatusCode::kConnectionLost:
      return "CONNECTION_LOST";
    case StatusCode::kCanceled:
      return "CANCELED";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kDataCorrupted:
      return "DATA_CORRUPTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  if (!message_.empty()) s += ": " + message_;
  return s;
}

std::string_view OpName(Op op) { return op == Op::kRead ? "READ" : "WRITE"; }
std::string_view RequestStateName(RequestState s) {
  switch (s) {
    case RequestState::kWaiting:
      return "WAITING";
    case RequestState::kCompleted:
      return "COMPLETED";
    case RequestState::kFailed:
      return "FAILED";
    case RequestState::kTimeout:
      return "TIMEOUT";
    case RequestState::kCanceled:
      return "CANCELED";
  }
  return "UNKNOWN";
}
std::string_view NotifyOutcomeName(NotifyOutcome o) {
  switch (o) {
    case NotifyOutcome::kCompleted:
      return "COMPLETED";
    case NotifyOutcome::kFailed:
      return "FAILED";
    case NotifyOutcome::kTimedOut:
      return "TIMED_OUT";
    case NotifyOutcome::kCanceled:
      return "CANCELED";
    case NotifyOutcome::kInitiatorLost:
      return "INITIATOR_LOST";
  }
  return "UNKNOWN";
}

namespace {
constexpr std::string_view kStagingNames[] = {"auto", "always", "off"};
}  // namespace

bool ParseStaging(std::string_view text, Staging* out) { return text::ParseEnum(text, kStagingNames, out); }

std::vector<std::string> SplitList(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const size_t comma = std::min(text.find(','), text.size());
    if (comma > 0) out.emplace_back(text.substr(0, comma));
    text.remove_prefix(std::min(comma + 1, text.size()));
  }
  return out;
}
std::string_view StagingName(Staging s) { return text::EnumName(s, kStagingNames); }

}  // namespace xfer
