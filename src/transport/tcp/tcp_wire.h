// The tcp transport's wire format (described in tcp_transport.h): constants and helpers that
// both sides of a data connection use.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "transport/link.h"
#include "util/crypto.h"
#include "util/net.h"
#include "xfer/status.h"

namespace xfer::transport::tcp_wire {

constexpr uint32_t kDataMagic = 0x31444658;  // "XFD1"
constexpr uint16_t kDataVersion = 4;         // 3: the challenge of an authenticated engine; 4: checksums
constexpr size_t kHelloBytes = 64;           // 24 used
constexpr size_t kAcceptBytes = 64;          // 4 used
// A data connection's first bytes: the hello of the initiator of that incarnation to the
// target of this one.
std::array<uint8_t, kHelloBytes> DataHello(uint64_t target, uint64_t initiator);

// With a secret, the target answers the hello with a fresh nonce and the initiator proves it
// knows the session key its control session derived (control/auth.h): the incarnations in the
// hello are then no credential. The proof covers the nonce and both incarnations.
crypto::Mac DataProof(const std::string& key, const uint8_t* nonce, uint64_t target, uint64_t initiator);

// Batch flags (the header's third byte).
constexpr uint8_t kChecksummed = 1;  // the payload is followed by its checksum (kTrailerBytes)
constexpr uint64_t kTrailerBytes = 8;
// The status of a batch whose checksum did not match (op: "WRITE", ...; where: "here", ...).
Status Mismatch(std::string_view op, std::string_view where);

constexpr size_t kBatchHeaderBytes = 16;
constexpr size_t kSliceBytes = 16;
constexpr size_t kReplyHeaderBytes = 8;
constexpr uint32_t kMaxMessage = 4096;
constexpr auto kForever = Clock::time_point::max();

// Every frame is a whole number of kAlign bytes, and a payload starts at a frame offset with
// the same remainder mod kAlign as its source address. The kernel copies a thread's sends into
// consecutive offsets of page fragments, so the copy into the socket then runs with source and
// destination equally aligned; misaligned, it can run at half the speed (bench/RESULTS.md,
// "How the defaults were chosen").
constexpr uint64_t kAlign = 64;
inline constexpr uint8_t kZeros[kAlign] = {};
constexpr uint64_t PadFor(uint64_t pos, uint64_t want) { return (want - pos) & (kAlign - 1); }
uint8_t* PadSink();  // this thread's kAlign bytes to receive padding into

template <class T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Large socket buffers keep a link busy across the round trip that ends each batch. Data
// sockets block, so bulk transfers wait in the kernel (MSG_WAITALL) rather than wake up once
// per segment; small reads pass MSG_DONTWAIT, spin briefly, then poll.
void TuneSocket(int fd);

}  // namespace xfer::transport::tcp_wire
