// Feeds arbitrary bytes to the control-plane decoder: header first, then the payload as
// whichever type the header names. Any crash, leak or UB report is a bug.
#include <cstddef>
#include <cstdint>

#include "control/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xfer::wire;
  std::span<const uint8_t> bytes(data, size);
  Header h;
  std::string why;
  if (DecodeHeader(bytes, &h, &why)) {
    auto payload = bytes.subspan(kHeaderSize);
    if (payload.size() > h.length) payload = payload.first(h.length);
    Message m;
    if (DecodePayload(h.type, payload, &m, &why)) {
      // What decodes must encode back to the same payload.
      std::vector<uint8_t> again = Encode(m);
      if (again.size() - kHeaderSize != payload.size()) __builtin_trap();
    }
  }
  // Also try the raw bytes as every payload type.
  for (uint16_t t = 1; t <= static_cast<uint16_t>(kLastMsgType); ++t) {
    Message m;
    DecodePayload(static_cast<MsgType>(t), bytes, &m, &why);
  }
  return 0;
}
