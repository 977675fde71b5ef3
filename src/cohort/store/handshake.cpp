#include "cohort/store/handshake.h"

#include <c10/util/Exception.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "cohort/errors.h"

namespace cohort::store::handshake {
namespace {

// Distinct per direction, so that neither end's first message can pass for the other's.
constexpr std::uint8_t kServerMagic[kMagicSize] = {'C', 'H', 'K', 'S'};
constexpr std::uint8_t kClientMagic[kMagicSize] = {'C', 'H', 'K', 'C'};

// HMAC-SHA256 keyed by the token over label || server nonce || client nonce. The
// label keeps the client's proof, the server's proof and each session key apart, so
// that no value the protocol reveals can be replayed as another.
Bytes mac(const std::string& token, std::string_view label, const Bytes& server_nonce, const Bytes& client_nonce) {
  Bytes message(label.begin(), label.end());
  message.insert(message.end(), server_nonce.begin(), server_nonce.end());
  message.insert(message.end(), client_nonce.begin(), client_nonce.end());
  Bytes out(kMacSize);
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(), out.data(),
           &size) == nullptr ||
      size != kMacSize)
    throw CommError("cohort: HMAC-SHA256 failed inside OpenSSL; the store cannot authenticate peers");
  return out;
}

bool same_secret(const std::uint8_t* a, const Bytes& b) { return CRYPTO_memcmp(a, b.data(), b.size()) == 0; }

}  // namespace

Bytes random_nonce() {
  Bytes out(kNonceSize);
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    throw CommError("cohort: OpenSSL's random generator failed; the store cannot make a handshake nonce");
  return out;
}

Bytes server_hello(const Bytes& server_nonce) {
  TORCH_INTERNAL_ASSERT(server_nonce.size() == kNonceSize);
  Bytes out(std::begin(kServerMagic), std::end(kServerMagic));
  out.push_back(kVersion);
  out.insert(out.end(), server_nonce.begin(), server_nonce.end());
  return out;
}

Bytes parse_server_hello(const Bytes& message) {
  if (message.size() != kServerHelloSize || !std::equal(std::begin(kServerMagic), std::end(kServerMagic),
                                                        message.begin()) ||
      message[kMagicSize] != kVersion)
    return {};
  return Bytes(message.begin() + kMagicSize + 1, message.end());
}

Bytes client_hello(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce) {
  TORCH_INTERNAL_ASSERT(server_nonce.size() == kNonceSize && client_nonce.size() == kNonceSize);
  Bytes out(std::begin(kClientMagic), std::end(kClientMagic));
  out.push_back(kVersion);
  out.insert(out.end(), client_nonce.begin(), client_nonce.end());
  auto proof = mac(token, "client", server_nonce, client_nonce);
  out.insert(out.end(), proof.begin(), proof.end());
  return out;
}

bool plausible_client_hello(const std::uint8_t* data, std::size_t n) {
  return std::memcmp(data, kClientMagic, std::min(n, kMagicSize)) == 0;
}

HelloCheck check_client_hello(const std::string& token, const Bytes& server_nonce, const Bytes& message,
                              Bytes& client_nonce) {
  if (message.size() != kClientHelloSize || !plausible_client_hello(message.data(), message.size()))
    return HelloCheck::kNotCohort;
  if (message[kMagicSize] != kVersion) return HelloCheck::kWrongVersion;
  const auto* nonce = message.data() + kMagicSize + 1;
  Bytes theirs(nonce, nonce + kNonceSize);
  if (!same_secret(nonce + kNonceSize, mac(token, "client", server_nonce, theirs))) return HelloCheck::kWrongToken;
  client_nonce = std::move(theirs);
  return HelloCheck::kAccepted;
}

Bytes server_proof(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce) {
  return mac(token, "server", server_nonce, client_nonce);
}

bool check_server_proof(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce,
                        const Bytes& proof) {
  return proof.size() == kProofSize && same_secret(proof.data(), server_proof(token, server_nonce, client_nonce));
}

SessionKeys session_keys(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce) {
  return {mac(token, "c2s", server_nonce, client_nonce), mac(token, "s2c", server_nonce, client_nonce)};
}

}  // namespace cohort::store::handshake
