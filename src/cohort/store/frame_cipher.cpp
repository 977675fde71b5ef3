#include "cohort/store/frame_cipher.h"

#include <c10/util/Exception.h>
#include <openssl/evp.h>

#include <algorithm>

#include "cohort/errors.h"

namespace cohort::store {

constexpr std::size_t kIvSize = 12;

// The key schedule is set up once per connection; each frame only sets its nonce.
struct CipherContext {
  EVP_CIPHER_CTX* ctx = nullptr;
  CipherContext(const Bytes& key, bool encrypt) : ctx(EVP_CIPHER_CTX_new()) {
    TORCH_INTERNAL_ASSERT(key.size() == 32, "AES-256 needs a 32-byte key");
    bool ok = ctx != nullptr &&
              EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), nullptr, nullptr, nullptr, encrypt ? 1 : 0) == 1 &&
              EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, kIvSize, nullptr) == 1 &&
              EVP_CipherInit_ex(ctx, nullptr, nullptr, key.data(), nullptr, encrypt ? 1 : 0) == 1;
    if (!ok) {
      EVP_CIPHER_CTX_free(ctx);
      throw CommError("cohort: OpenSSL could not set up AES-256-GCM for a store connection");
    }
  }
  ~CipherContext() { EVP_CIPHER_CTX_free(ctx); }
};

namespace {

// 4 zero bytes then the frame counter, big-endian. A fresh pair of keys per
// connection means a counter value is never used twice under one key.
void nonce_for(std::uint64_t counter, std::uint8_t* iv) {
  for (std::size_t i = 0; i < 4; ++i) iv[i] = 0;
  for (std::size_t i = 0; i < 8; ++i) iv[4 + i] = static_cast<std::uint8_t>(counter >> (56 - 8 * i));
}

void put_length(std::uint32_t n, std::uint8_t* out) {
  for (std::size_t i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(n >> (24 - 8 * i));
}

}  // namespace

FrameSealer::FrameSealer(const Bytes& key) : ctx_(std::make_unique<CipherContext>(key, true)) {}
FrameSealer::~FrameSealer() = default;

Bytes FrameSealer::seal(const Bytes& payload) {
  TORCH_CHECK(payload.size() <= kMaxFramePayload, "cohort: a store request or reply of ", payload.size(),
              " bytes exceeds the protocol's limit of ", kMaxFramePayload, " bytes; store smaller values");
  Bytes frame(kFrameHeaderSize + payload.size() + kFrameTagSize);
  put_length(static_cast<std::uint32_t>(payload.size()), frame.data());
  std::uint8_t iv[kIvSize];
  nonce_for(counter_++, iv);
  auto* c = ctx_->ctx;
  int n = 0;
  std::uint8_t rest[kFrameTagSize];
  bool ok = EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv) == 1 &&
            EVP_EncryptUpdate(c, nullptr, &n, frame.data(), kFrameHeaderSize) == 1 &&
            (payload.empty() || EVP_EncryptUpdate(c, frame.data() + kFrameHeaderSize, &n, payload.data(),
                                                  static_cast<int>(payload.size())) == 1) &&
            EVP_EncryptFinal_ex(c, rest, &n) == 1 &&  // GCM writes nothing here
            EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kFrameTagSize,
                                frame.data() + kFrameHeaderSize + payload.size()) == 1;
  if (!ok) throw CommError("cohort: OpenSSL failed to encrypt a store frame");
  return frame;
}

FrameOpener::FrameOpener(const Bytes& key) : ctx_(std::make_unique<CipherContext>(key, false)) {}
FrameOpener::~FrameOpener() = default;

std::optional<std::size_t> FrameOpener::frame_size(const std::uint8_t* header) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < 4; ++i) n = (n << 8) | header[i];
  if (n > kMaxFramePayload) return std::nullopt;
  return kFrameHeaderSize + n + kFrameTagSize;
}

std::optional<Bytes> FrameOpener::open(const std::uint8_t* frame, std::size_t size) {
  auto expected = frame_size(frame);
  if (!expected || *expected != size) return std::nullopt;
  const std::size_t n = size - kFrameHeaderSize - kFrameTagSize;
  Bytes payload(n);
  std::uint8_t iv[kIvSize];
  nonce_for(counter_, iv);
  std::uint8_t tag[kFrameTagSize];
  std::copy(frame + kFrameHeaderSize + n, frame + size, tag);
  auto* c = ctx_->ctx;
  int out = 0;
  std::uint8_t rest[kFrameTagSize];
  bool ok = EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv) == 1 &&
            EVP_DecryptUpdate(c, nullptr, &out, frame, kFrameHeaderSize) == 1 &&
            (n == 0 ||
             EVP_DecryptUpdate(c, payload.data(), &out, frame + kFrameHeaderSize, static_cast<int>(n)) == 1) &&
            EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kFrameTagSize, tag) == 1 &&
            EVP_DecryptFinal_ex(c, rest, &out) > 0;
  if (!ok) return std::nullopt;
  ++counter_;
  return payload;
}

}  // namespace cohort::store
