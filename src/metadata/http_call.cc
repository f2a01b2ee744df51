#include "metadata/http_call.h"

#include <curl/curl.h>

#include <memory>
#include <mutex>

namespace xfer::metadata {

namespace {

std::once_flag curl_once;

struct Collected {
  std::string* body;
  size_t max;
  bool overflow = false;
};

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* c = static_cast<Collected*>(out);
  if (c->body->size() + size * n > c->max) {
    c->overflow = true;
    return 0;  // (curl ends the transfer: CURLE_WRITE_ERROR)
  }
  c->body->append(data, size * n);
  return size * n;
}

CURL* ThreadHandle() {
  CurlInit();
  thread_local std::unique_ptr<CURL, void (*)(CURL*)> curl(nullptr, curl_easy_cleanup);
  if (curl) {
    curl_easy_reset(curl.get());
  } else {
    curl.reset(curl_easy_init());
  }
  return curl.get();
}

}  // namespace

Status HttpCall(const HttpRequest& request, HttpReply* reply) {
  CURL* curl = ThreadHandle();
  if (curl == nullptr) return {StatusCode::kResourceExhausted, "curl_easy_init failed"};
  const std::string type = std::string("Content-Type: ") + request.content_type;
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(curl_slist_append(nullptr, type.c_str()),
                                                             curl_slist_free_all);
  reply->body.clear();
  Collected collected{&reply->body, request.max_reply};
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  if (request.body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body->c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.body->size()));
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &collected);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout.count()));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.timeout.count()));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  const CURLcode rc = curl_easy_perform(curl);
  if (collected.overflow) {
    return {StatusCode::kResourceExhausted,
            "the answer is longer than " + std::to_string(request.max_reply) + " bytes"};
  }
  if (rc != CURLE_OK) return {StatusCode::kNotConnected, curl_easy_strerror(rc)};
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply->status);
  return Status::Ok();
}

void CurlInit() {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace xfer::metadata
