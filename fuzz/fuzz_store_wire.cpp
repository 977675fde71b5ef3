// The store server's decoding of a peer's bytes once TLS has opened them (Note
// [Store protocol]): frames, then the requests inside them, applied to a table.
//
// Input: one selector byte, then
//   odd: raw bytes of the frame stream, as process_frames() consumes them;
//   even: requests, each [u16 length][payload], framed, unframed, decoded and
//        applied as the server does; the payloads also go through the client's
//        decode_reply.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/store/table.h"
#include "cohort/store/wire.h"
#include "fuzz_support.h"

namespace {

using cohort::store::Bytes;

// What ServerLoop::process_frames does with the bytes received so far.
void frames(const std::uint8_t* data, std::size_t size) {
  cohort::store::Table table;
  std::size_t pos = 0;
  while (size - pos >= cohort::store::kFrameHeaderSize) {
    const std::size_t n = cohort::store::framed_size(data + pos);
    if (n > cohort::store::kMaxFramePayload || size - pos - cohort::store::kFrameHeaderSize < n) return;
    const auto* start = data + pos + cohort::store::kFrameHeaderSize;
    pos += cohort::store::kFrameHeaderSize + n;
    auto request = cohort::store::decode_request(Bytes(start, start + n));
    if (!request) return;
    (void)table.apply(*request);
  }
}

void requests(const std::uint8_t* data, std::size_t size) {
  cohort::store::Table table;
  std::size_t pos = 0;
  while (size - pos >= 2) {
    std::size_t n = (std::size_t{data[pos]} << 8) | data[pos + 1];
    pos += 2;
    n = std::min(n, size - pos);
    Bytes payload(data + pos, data + pos + n);
    pos += n;
    (void)cohort::store::decode_reply(payload);
    auto framed = cohort::store::frame(payload);
    if (cohort::store::framed_size(framed.data()) != payload.size()) std::abort();
    Bytes opened(framed.begin() + cohort::store::kFrameHeaderSize, framed.end());
    if (opened != payload) std::abort();
    auto request = cohort::store::decode_request(opened);
    if (!request) continue;
    if (cohort::store::decode_request(cohort::store::encode(*request)) == std::nullopt) std::abort();
    if (auto reply = table.apply(*request)) {
      if (!cohort::store::decode_reply(cohort::store::encode(*reply))) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  cohort::fuzz::expect_cohort_errors([&] {
    if (data[0] % 2 == 1) return frames(data + 1, size - 1);
    return requests(data + 1, size - 1);
  });
  return 0;
}
