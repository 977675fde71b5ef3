#pragma once
// Sealing and opening the frames of an authenticated store connection with
// AES-256-GCM (see Note [Store protocol]). One FrameSealer per direction on the
// sending end, one FrameOpener on the receiving end, both keyed from the handshake.
//
// A frame on the wire: [u32 big-endian n][n bytes of ciphertext][16-byte tag]. The
// length is authenticated too (it is the AEAD's associated data), and the 96-bit
// GCM nonce is the frame's number in its direction, which both ends count. A
// replayed, dropped, reordered or altered frame therefore fails to open.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace cohort::store {

using Bytes = std::vector<std::uint8_t>;

inline constexpr std::size_t kFrameHeaderSize = 4;
inline constexpr std::size_t kFrameTagSize = 16;
// The largest payload a frame may carry. A bigger announced length closes the
// connection before any of it is buffered.
inline constexpr std::size_t kMaxFramePayload = std::size_t{256} << 20;

struct CipherContext;  // OpenSSL's, kept out of this header

class FrameSealer {
 public:
  explicit FrameSealer(const Bytes& key);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  // The whole frame for `payload` (at most kMaxFramePayload bytes).
  Bytes seal(const Bytes& payload);

 private:
  std::unique_ptr<CipherContext> ctx_;
  std::uint64_t counter_ = 0;
};

class FrameOpener {
 public:
  explicit FrameOpener(const Bytes& key);
  ~FrameOpener();
  FrameOpener(const FrameOpener&) = delete;
  FrameOpener& operator=(const FrameOpener&) = delete;

  // The size of the whole frame that starts with `header` (kFrameHeaderSize bytes),
  // or nullopt when it announces more than kMaxFramePayload.
  static std::optional<std::size_t> frame_size(const std::uint8_t* header);

  // The payload of the whole frame [frame, frame + size), or nullopt when it fails
  // authentication. After a failure the connection must be dropped.
  std::optional<Bytes> open(const std::uint8_t* frame, std::size_t size);

 private:
  std::unique_ptr<CipherContext> ctx_;
  std::uint64_t counter_ = 0;
};

}  // namespace cohort::store
