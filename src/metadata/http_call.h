// HttpCall: one HTTP request through libcurl, on a handle kept per thread and reset for each
// call, so its connections to a server are kept and reused (a lease renewed once a second
// would otherwise open a connection each time). Bounded by the request's timeout; never
// through a proxy (metadata services are reached directly); no signals (threads).
#pragma once

#include <chrono>
#include <string>

#include "xfer/status.h"

namespace xfer::metadata {

struct HttpRequest {
  const char* method = "GET";  // GET, PUT, POST, DELETE
  std::string url;
  const std::string* body = nullptr;  // sent when set
  const char* content_type = "application/json";
  std::chrono::milliseconds timeout{1000};
  size_t max_reply = 1 << 20;  // a longer answer is cut off: the call fails
};

struct HttpReply {
  long status = 0;  // HTTP status
  std::string body;
};

// Ok once an answer came, whatever its status; kNotConnected with curl's reason when none did
// (kResourceExhausted: an answer over max_reply).
Status HttpCall(const HttpRequest& request, HttpReply* reply);

// libcurl's global set-up, once per process (before any other call of it).
void CurlInit();

}  // namespace xfer::metadata
