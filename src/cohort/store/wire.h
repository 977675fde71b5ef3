#pragma once
// The requests and replies of cohort's key-value store, and their encoding inside
// a sealed frame.
//
// Note [Store protocol]
// c10d's TCPStore lets anyone who reaches the port read and write every key, and a
// `cohort run` job's store holds what its workers trust (addresses, ranks, restart
// counts). So cohort's store admits only peers that hold the job's token (the
// shared secret of --rdzv-token / COHORT_RDZV_TOKEN), and the token never crosses
// the wire. Over TCP:
//
//  1. server -> client  "CHKS" version ns                 ns: 32 random bytes
//  2. client -> server  "CHKC" version nc HMAC(token, "client" || ns || nc)
//  3. server -> client  a verdict byte; when it is "accepted", HMAC(token, "server" || ns || nc)
//
// Each side proves it holds the token on nonces the other chose, so a recorded
// exchange cannot be replayed, and a client never trusts an impostor server. The
// server compares proofs in constant time (CRYPTO_memcmp). A refused peer gets the
// verdict, is disconnected, counted (StoreServer::refused()) and reported
// (StoreServerOptions::on_refused). Before step 2 verifies, the server reads no
// more than a client hello's bytes from a peer, drops a peer whose first bytes are
// not the magic, drops one that has not finished within the handshake timeout, and
// keeps at most kMaxPendingHandshakes such peers at a time, evicting the oldest to
// take a newcomer (Note [Pending handshakes under a flood] in server_loop.h).
//
// Every later byte travels in frames sealed with AES-256-GCM (frame_cipher.h),
// keyed per direction with HMAC(token, "c2s" || ns || nc) and HMAC(token, "s2c" ||
// ns || nc): values stay private, and a frame altered, replayed or injected by
// anyone without the token fails to open and closes the connection.
//
// Inside a frame, a request is one op byte, a signed 64-bit number (the delta of
// ADD, the timeout in milliseconds of GET/WAIT/MULTI_GET), a list of keys and a list
// of values; a reply is a status byte, a number, a list of keys and a list of values.
// Integers are big-endian; lists are a u32 count of u32-length-prefixed strings.
// A client has at most one request in flight per connection. GET, WAIT and
// MULTI_GET whose keys are missing are parked in the server (which never blocks on
// one client) until the keys exist (reply OK) or their timeout passes (reply
// TIMEOUT, naming the keys still missing).
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
};

enum class Status : std::uint8_t {
  kOk = 0,
  kTimeout = 1,  // keys: those still missing
  kError = 2,    // values[0]: the message, e.g. ADD on a value that is not a number,
                 // or a write over a cap (Note [Store memory caps] in store/table.h)
};

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
// nullopt when `payload` is not a well-formed request: an unknown op, or the wrong
// number of keys or values for it. The server then drops the connection.
std::optional<Request> decode_request(const Bytes& payload);
std::optional<Reply> decode_reply(const Bytes& payload);

// "GET", "WAIT", ... for messages.
const char* op_name(Op op);

}  // namespace cohort::store
