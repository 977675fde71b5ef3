#pragma once
// One HTTP request of EtcdClient's to one etcd member, and how its outcome reads:
// served, a member that cannot serve it now, or a refusal. Internal: not installed.
#include <nlohmann/json.hpp>

#include <string>

#include "cohort/store/etcd_client_internal.h"

namespace cohort::store {

// gRPC's status codes, which etcd's gateway passes on in its error replies.
inline constexpr int kInvalidArgument = 3;
inline constexpr int kPermissionDenied = 7;
inline constexpr int kResourceExhausted = 8;
inline constexpr int kFailedPrecondition = 9;
inline constexpr int kUnauthenticated = 16;

// Whether etcd's or curl's message `s` says `part`.
inline bool mentions(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

struct EtcdClient::Attempt {
  enum class Kind { kOk, kUnavailable, kUnauthenticated, kRefused };
  Kind kind = Kind::kUnavailable;
  nlohmann::json reply;
  std::string why;  // what the member said, for messages
  int code = 0;     // gRPC's status code of an error reply
  bool tls = false;  // no TLS session: certificates, or a scheme the member does not speak
};

}  // namespace cohort::store
