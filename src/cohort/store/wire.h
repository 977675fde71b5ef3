#pragma once
// The requests and replies of cohort's key-value store, and their encoding inside
// a frame.
//
// Note [Store protocol]
// c10d's TCPStore lets anyone who reaches the port read and write every key, and a
// `cohort run` job's store holds what its workers trust (addresses, ranks, restart
// counts). So cohort's store admits only peers that hold the job's token (the
// shared secret of --rdzv-token / COHORT_RDZV_TOKEN), and the token never crosses
// the wire. Every connection is TLS 1.3 (OpenSSL; store/tls.h) with an external
// pre-shared key: HMAC-SHA384 of a fixed label under the token, offered under the
// identity "cohort-store/2", which also names the protocol's version. No
// certificates by default (a site can add them: Note [Certificates and the token]
// in store/certificates.h). What that gives:
//  - Mutual proof. The client's PSK binder proves the key to the server before the
//    server answers; the server's Finished proves it to the client, which also
//    checks that the key was used (a server that has no key and tries a certificate
//    instead fails: the client trusts none). A peer with another token fails the
//    binder: the server refuses it with decrypt_error, and each side reports "a
//    different token". Nonces and the transcript bind both proofs to this
//    connection, so a recorded handshake cannot be replayed.
//  - Forward secrecy. Only the psk_dhe_ke mode is allowed (no
//    SSL_OP_ALLOW_NO_DHE_KEX), so every connection's keys also depend on an
//    ephemeral (EC)DHE exchange: whoever records the traffic and later learns the
//    token still cannot decrypt it.
//  - Privacy and integrity of every key and value (AES-256-GCM inside TLS).
//  - The client speaks first, so a peer that does not speak TLS (a stock c10d
//    TCPStore client, a port scan) is closed before the server sends a byte that it
//    could misread; its first byte tells the server so.
// A refused peer is disconnected, counted (StoreServer::refused()) and reported
// (StoreServerOptions::on_refused). Before the handshake completes, the server
// reads only TLS handshake records from a peer, drops one that has not finished
// within the handshake timeout, and keeps at most kMaxPendingHandshakes such peers
// at a time, evicting the oldest to take a newcomer (Note [Pending handshakes under
// a flood] in server_loop.h).
//
// Inside TLS, each message is a frame: [u32 big-endian n][n bytes of payload], n at
// most kMaxFramePayload.
// Inside a frame, a request is one op byte, a signed 64-bit number (the delta of
// ADD, the timeout in milliseconds of GET/WAIT/MULTI_GET), a list of keys and a list
// of values; a reply is a status byte, a number, a list of keys and a list of values.
// Integers are big-endian; lists are a u32 count of u32-length-prefixed strings.
// A client has at most one request in flight per connection. GET, WAIT and
// MULTI_GET whose keys are missing are parked in the server (which never blocks on
// one client) until the keys exist (reply OK) or their timeout passes (reply
// TIMEOUT, naming the keys still missing).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cohort::store {

using Bytes = std::vector<std::uint8_t>;

enum class Op : std::uint8_t {
  kSet = 1,
  kGet,         // waits for the key
  kCompareSet,  // values: expected, desired
  kAdd,
  kDelete,
  kCheck,
  kNumKeys,
  kWait,
  kAppend,
  kMultiGet,  // waits for every key
  kMultiSet,
  // With certificates, a session's first request and nothing else: values[0] is the
  // client's proof of the token, the reply's values[0] the server's (Note
  // [Certificates and the token] in store/certificates.h). The table never sees it.
  kProve,
};

enum class Status : std::uint8_t {
  kOk = 0,
  kTimeout = 1,  // keys: those still missing
  kError = 2,    // values[0]: the message, e.g. ADD on a value that is not a number,
                 // or a write over a cap (Note [Store memory caps] in store/table.h)
};

// An error reply's number: the server closes the connection after it (a limit was
// broken, Note [Closing with an error]); 0 when the connection goes on.
inline constexpr std::int64_t kConnectionClosing = 1;

struct Request {
  Op op = Op::kSet;
  std::int64_t number = 0;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
};

struct Reply {
  Status status = Status::kOk;
  std::int64_t number = 0;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
};

Bytes encode(const Request& request);
Bytes encode(const Reply& reply);
// nullopt when `payload` is not a well-formed request: an unknown op, the wrong
// number of keys or values for it, or more than kMaxItemsPerList of either. The
// server then drops the connection.
std::optional<Request> decode_request(const Bytes& payload);
// The same over bytes in place (the server decodes from its input buffer, uncopied).
std::optional<Request> decode_request(const std::uint8_t* data, std::size_t size);
std::optional<Reply> decode_reply(const Bytes& payload);

inline constexpr std::size_t kFrameHeaderSize = 4;
// The largest payload a frame may carry; a bigger announced length is refused before
// any of it is buffered.
inline constexpr std::size_t kMaxFramePayload = std::size_t{256} << 20;

// Note [Items per request]: a key decoded costs a std::string (32 bytes) however
// short it is, so a 64 MiB WAIT of 16 million empty keys took over 500 MB once
// decoded and parked (launcher-store repro D1: a 16 MB WAIT grew the store by
// 302 MB). A request or reply carries at most this many keys and this many values,
// which bounds what decoding may add to about 2 MiB beyond the frame. c10d and
// cohort name one key per rank at most (a barrier's arrivals), so this admits
// worlds of 65536 ranks.
inline constexpr std::uint32_t kMaxItemsPerList = std::uint32_t{1} << 16;

// The frame around `payload`; throws when it is over kMaxFramePayload.
Bytes frame(const Bytes& payload);
// The payload size that the kFrameHeaderSize bytes at `header` announce.
std::size_t framed_size(const std::uint8_t* header);

// "GET", "WAIT", ... for messages.
const char* op_name(Op op);

}  // namespace cohort::store
