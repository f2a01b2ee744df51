// Status: the result of every public xfer call. No exceptions cross the API.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace xfer {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // bad input from the caller: null, zero length, unknown handle, bad name
  kTimeout,             // a deadline passed
  kNotConnected,        // no session to that peer (and auto-connect is off or failed)
  kAlreadyConnected,    // Connect() to a peer that already has a session
  kUnsupported,         // the build, the machine or the peer cannot do this
  kResourceExhausted,   // out of memory, fds, threads, request slots
  kRemoteAccessDenied,  // the remote range is not inside one of the peer's registered regions
  kConnectionLost,      // the peer died, hung, restarted or said goodbye
  kCanceled,            // Cancel() was called
  kInternal,            // a bug or an unexpected system error; the message says which
  kDataCorrupted,       // bytes differ where they landed (TransferOptions::checksum), or a tcp
                        // batch's checksum did not match twice (EngineOptions::tcp.checksum)
};
inline constexpr StatusCode kLastStatusCode = StatusCode::kDataCorrupted;

// Short stable name of a code, e.g. "REMOTE_ACCESS_DENIED".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "CODE: message".
  std::string ToString() const;

  bool operator==(StatusCode c) const { return code_ == c; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace xfer
