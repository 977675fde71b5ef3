#pragma once
// The mutual challenge-response that opens every store connection, as pure
// functions over byte strings: no sockets here, so both ends and the tests share
// one implementation. See Note [Store protocol] for the exchange as a whole.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::store::handshake {

using Bytes = std::vector<std::uint8_t>;

inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::size_t kMagicSize = 4;
inline constexpr std::size_t kNonceSize = 32;
inline constexpr std::size_t kMacSize = 32;  // HMAC-SHA256
// magic, version, server nonce
inline constexpr std::size_t kServerHelloSize = kMagicSize + 1 + kNonceSize;
// magic, version, client nonce, client proof
inline constexpr std::size_t kClientHelloSize = kMagicSize + 1 + kNonceSize + kMacSize;
// A verdict byte; the server's proof follows only when the verdict is kAccepted.
inline constexpr std::size_t kProofSize = kMacSize;

enum class Verdict : std::uint8_t { kAccepted = 1, kWrongToken = 2, kWrongVersion = 3 };

// What the server makes of a client hello.
enum class HelloCheck { kAccepted, kNotCohort, kWrongVersion, kWrongToken };

// kNonceSize bytes from OpenSSL's CSPRNG; throws CommError if it fails.
Bytes random_nonce();

Bytes server_hello(const Bytes& server_nonce);
// The server nonce, or empty when `message` is not a hello of this protocol version.
Bytes parse_server_hello(const Bytes& message);

Bytes client_hello(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce);
// Whether the first `n` (< kClientHelloSize) bytes a peer sent can begin a client
// hello, so that a stranger is dropped after its first bytes.
bool plausible_client_hello(const std::uint8_t* data, std::size_t n);
// Checks a whole client hello; on kAccepted stores the client's nonce in `client_nonce`.
HelloCheck check_client_hello(const std::string& token, const Bytes& server_nonce, const Bytes& message,
                              Bytes& client_nonce);

// The server's answer to a client that proved the token: it proves it holds it too.
Bytes server_proof(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce);
bool check_server_proof(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce,
                        const Bytes& proof);

// The AES-256-GCM keys of one connection, one per direction.
struct SessionKeys {
  Bytes client_to_server;
  Bytes server_to_client;
};
SessionKeys session_keys(const std::string& token, const Bytes& server_nonce, const Bytes& client_nonce);

}  // namespace cohort::store::handshake
