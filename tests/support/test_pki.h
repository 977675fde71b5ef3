#pragma once
// A throwaway public-key infrastructure for tests of the store's certificates: a
// CA, and hosts' certificates signed by it, made with the `openssl` command (EC
// P-256 keys, valid for two days) in a directory of their own.
#include <map>
#include <string>

#include "cohort/store/certificates.h"
#include "support/temp_dir.h"

namespace cohort::testing {

class TestPki {
 public:
  // Makes the CA; throws std::runtime_error with openssl's output when it fails.
  explicit TestPki(const std::string& ca_name = "cohort-test-ca");

  // A certificate for `host`, signed by this CA, with its key: what a host of the
  // job is given.
  store::Certificates issue(const std::string& host);
  // The same with `host` as its subjectAltName too (IP:... for an address, DNS:...
  // otherwise), as HTTPS clients such as libcurl check it (the etcd store's tests).
  store::Certificates issue_with_alt_name(const std::string& host);
  // A private key under a passphrase ("secret").
  std::string encrypted_key();
  // The COHORT_STORE_TLS_* variables for `certificates`.
  static std::map<std::string, std::string> variables(const store::Certificates& certificates);

  const std::string& ca_file() const { return ca_file_; }

 private:
  TempDir dir_{"cohort-pki"};
  std::string ca_file_;
  std::string ca_key_;
};

}  // namespace cohort::testing
