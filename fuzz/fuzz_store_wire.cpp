// The store server's decoding of a peer's bytes (Note [Store protocol]): the client
// hello, then sealed frames, then the requests inside them, applied to a table.
//
// Input: one selector byte, then
//   0: a client hello, fed to the checks in the pieces the server reads it in;
//   1: raw bytes of the frame stream, as process_frames() consumes them (frames that
//      nobody sealed with the key: length checks and authentication failures);
//   2: requests, each [u16 length][payload], sealed with the connection's key so they
//      authenticate, then opened, decoded and applied as the server does; the
//      payloads also go through the client's decode_reply.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/store/frame_cipher.h"
#include "cohort/store/handshake.h"
#include "cohort/store/table.h"
#include "cohort/store/wire.h"
#include "fuzz_support.h"

namespace {

using cohort::store::Bytes;
namespace hs = cohort::store::handshake;

const std::string kToken = "fuzz-token";
const Bytes kServerNonce(hs::kNonceSize, 0x11);
const Bytes kClientNonce(hs::kNonceSize, 0x22);

void hello(const std::uint8_t* data, std::size_t size) {
  for (std::size_t n = 1; n <= size && n < hs::kClientHelloSize; ++n) (void)hs::plausible_client_hello(data, n);
  Bytes message(data, data + size);
  Bytes client_nonce;
  (void)hs::check_client_hello(kToken, kServerNonce, message, client_nonce);
  (void)hs::parse_server_hello(message);
  (void)hs::check_server_proof(kToken, kServerNonce, kClientNonce, message);
}

// What ServerLoop::process_frames does with the bytes received so far.
void frames(const std::uint8_t* data, std::size_t size) {
  auto keys = hs::session_keys(kToken, kServerNonce, kClientNonce);
  cohort::store::FrameOpener opener(keys.client_to_server);
  cohort::store::Table table;
  std::size_t pos = 0;
  while (size - pos >= cohort::store::kFrameHeaderSize) {
    auto frame_size = cohort::store::FrameOpener::frame_size(data + pos);
    if (!frame_size || size - pos < *frame_size) return;
    auto payload = opener.open(data + pos, *frame_size);
    pos += *frame_size;
    auto request = payload ? cohort::store::decode_request(*payload) : std::nullopt;
    if (!request) return;
    (void)table.apply(*request);
  }
}

void requests(const std::uint8_t* data, std::size_t size) {
  auto keys = hs::session_keys(kToken, kServerNonce, kClientNonce);
  cohort::store::FrameSealer sealer(keys.client_to_server);
  cohort::store::FrameOpener opener(keys.client_to_server);
  cohort::store::Table table;
  std::size_t pos = 0;
  while (size - pos >= 2) {
    std::size_t n = (std::size_t{data[pos]} << 8) | data[pos + 1];
    pos += 2;
    n = std::min(n, size - pos);
    Bytes payload(data + pos, data + pos + n);
    pos += n;
    (void)cohort::store::decode_reply(payload);
    auto frame = sealer.seal(payload);
    auto opened = opener.open(frame.data(), frame.size());
    if (!opened || *opened != payload) std::abort();  // a frame we sealed must open
    auto request = cohort::store::decode_request(*opened);
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
    switch (data[0] % 3) {
      case 0: return hello(data + 1, size - 1);
      case 1: return frames(data + 1, size - 1);
      default: return requests(data + 1, size - 1);
    }
  });
  return 0;
}
