#include "support/test_pki.h"

#include <fstream>
#include <stdexcept>

#include "support/subprocess.h"

namespace cohort::testing {
namespace {

using namespace std::chrono_literals;

void openssl(std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  auto r = run_process(args, 60s);
  if (r.exit_code != 0) throw std::runtime_error("test PKI: openssl " + args[1] + " failed: " + r.err);
}

const std::vector<std::string> kNewKey = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"};

}  // namespace

TestPki::TestPki(const std::string& ca_name) {
  ca_file_ = dir_.path + "/ca.pem";
  ca_key_ = dir_.path + "/ca.key";
  std::vector<std::string> args{"req", "-x509"};
  args.insert(args.end(), kNewKey.begin(), kNewKey.end());
  args.insert(args.end(), {"-keyout", ca_key_, "-out", ca_file_, "-subj", "/CN=" + ca_name, "-days", "2"});
  openssl(args);
}

store::Certificates TestPki::issue(const std::string& host) {
  const std::string base = dir_.path + "/" + host;
  std::vector<std::string> request{"req"};
  request.insert(request.end(), kNewKey.begin(), kNewKey.end());
  request.insert(request.end(), {"-keyout", base + ".key", "-out", base + ".csr", "-subj", "/CN=" + host});
  openssl(request);
  openssl({"x509", "-req", "-in", base + ".csr", "-CA", ca_file_, "-CAkey", ca_key_, "-CAcreateserial", "-out",
           base + ".pem", "-days", "2"});
  return store::Certificates{ca_file_, base + ".pem", base + ".key"};
}

store::Certificates TestPki::issue_with_alt_name(const std::string& host) {
  const std::string base = dir_.path + "/" + host + "-alt";
  const bool address = host.find_first_not_of("0123456789.") == std::string::npos;
  {
    std::ofstream ext(base + ".ext");
    ext << "subjectAltName=" << (address ? "IP:" : "DNS:") << host << "\n";
  }
  std::vector<std::string> request{"req"};
  request.insert(request.end(), kNewKey.begin(), kNewKey.end());
  request.insert(request.end(), {"-keyout", base + ".key", "-out", base + ".csr", "-subj", "/CN=" + host});
  openssl(request);
  openssl({"x509", "-req", "-in", base + ".csr", "-CA", ca_file_, "-CAkey", ca_key_, "-CAcreateserial", "-out",
           base + ".pem", "-days", "2", "-extfile", base + ".ext"});
  return store::Certificates{ca_file_, base + ".pem", base + ".key"};
}

std::string TestPki::encrypted_key() {
  const std::string path = dir_.path + "/encrypted.key";
  openssl({"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256", "-pass", "pass:secret",
           "-out", path});
  return path;
}

std::map<std::string, std::string> TestPki::variables(const store::Certificates& c) {
  return {{store::kCaVariable, c.ca_file}, {store::kCertVariable, c.cert_file}, {store::kKeyVariable, c.key_file}};
}

}  // namespace cohort::testing
