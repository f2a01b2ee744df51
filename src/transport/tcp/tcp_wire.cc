#include "transport/tcp/tcp_wire.h"

#include <sys/socket.h>

namespace xfer::transport::tcp_wire {

std::array<uint8_t, kHelloBytes> DataHello(uint64_t target, uint64_t initiator) {
  std::array<uint8_t, kHelloBytes> hello{};
  Put<uint32_t>(hello.data(), kDataMagic);
  Put<uint16_t>(hello.data() + 4, kDataVersion);
  Put<uint64_t>(hello.data() + 8, target);
  Put<uint64_t>(hello.data() + 16, initiator);
  return hello;
}

crypto::Mac DataProof(const std::string& key, const uint8_t* nonce, uint64_t target, uint64_t initiator) {
  std::string m = "xfer-data-v1";
  m.append(reinterpret_cast<const char*>(nonce), crypto::kNonceBytes);
  m.append(reinterpret_cast<const char*>(&target), sizeof target);
  m.append(reinterpret_cast<const char*>(&initiator), sizeof initiator);
  return crypto::Hmac(crypto::Bytes(key), crypto::Bytes(m));
}

Status Mismatch(std::string_view op, std::string_view where) {
  return {StatusCode::kDataCorrupted, "tcp: the checksum of a " + std::string(op) + " batch did not match " +
                                          std::string(where) + ": bytes were damaged on the way"};
}

uint8_t* PadSink() {
  static thread_local uint8_t sink[kAlign];
  return sink;
}

void TuneSocket(int fd) {
  net::SetNoDelay(fd);
  net::SetBlocking(fd);
  int size = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
}

}  // namespace xfer::transport::tcp_wire
