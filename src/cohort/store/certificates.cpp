#include "cohort/store/certificates.h"

#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cohort/errors.h"

namespace cohort::store {

Certificates certificates_from(const std::map<std::string, std::string>& env) {
  auto value = [&](const char* name) {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) return std::string();
    return std::filesystem::absolute(it->second).lexically_normal().string();
  };
  Certificates c{value(kCaVariable), value(kCertVariable), value(kKeyVariable)};
  if (!c.enabled()) return c;
  std::vector<std::string> missing;
  if (c.ca_file.empty()) missing.push_back(kCaVariable);
  if (c.cert_file.empty()) missing.push_back(kCertVariable);
  if (c.key_file.empty()) missing.push_back(kKeyVariable);
  if (!missing.empty())
    throw ConfigError(fmt::format("cohort: the store's certificates are set only in part: {} {} not set\n  fix: set "
                                  "all three of {}, {} and {} (PEM files: your CA, this host's certificate, its "
                                  "key), or none of them to use the token alone (docs/store_security.md)",
                                  fmt::join(missing, " and "), missing.size() == 1 ? "is" : "are", kCaVariable,
                                  kCertVariable, kKeyVariable));
  return c;
}

}  // namespace cohort::store
