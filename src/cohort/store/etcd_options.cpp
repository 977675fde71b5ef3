#include "cohort/store/etcd_options.h"

#include <fmt/format.h>

#include <filesystem>
#include <set>

#include "cohort/errors.h"

namespace cohort::store {
namespace {

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

}  // namespace

std::optional<EtcdHostPort> etcd_host_port(const std::string& endpoint) {
  std::string rest = endpoint;
  for (const char* scheme : {"http://", "https://"})
    if (starts_with(rest, scheme)) rest = rest.substr(std::string(scheme).size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return std::nullopt;
  const auto port = rest.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const int number = std::stoi(port);
  if (number < 1 || number > 65535 || rest.find_first_of(" /\t") != std::string::npos) return std::nullopt;
  return EtcdHostPort{rest.substr(0, colon), number};
}

std::vector<std::string> parse_etcd_endpoints(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    auto comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    auto entry = list.substr(start, comma - start);
    if (!etcd_host_port(entry))
      throw ConfigError(fmt::format("cohort: etcd endpoint '{}' in '{}' is not host:port\n  fix: pass the etcd "
                                    "members' client addresses as --rdzv-endpoint HOST:2379[,HOST:2379...]",
                                    entry, list));
    out.push_back(entry);
    start = comma + 1;
  }
  return out;
}

EtcdStoreOptions etcd_options_for_run(const std::string& endpoints, const std::string& run_id,
                                      const std::map<std::string, std::string>& conf,
                                      const std::map<std::string, std::string>& env) {
  if (run_id.empty())
    throw ConfigError("cohort: the etcd store needs a run id for its prefix\n  fix: pass --rdzv-id");
  // A '/' would put one job's keys inside another's prefix ("a" and "a/b"), and a
  // finished job deletes everything under its prefix.
  if (run_id.find('/') != std::string::npos)
    throw ConfigError(fmt::format("cohort: --rdzv-id {} holds a '/', which would put this job's keys inside another "
                                  "job's prefix in etcd\n  fix: use letters, digits, '-', '_' or '.'",
                                  run_id));
  auto list = parse_etcd_endpoints(endpoints);
  auto get = [&](const char* key) {
    auto it = conf.find(key);
    return it == conf.end() ? std::string() : it->second;
  };
  const auto protocol = get("protocol");
  if (!protocol.empty() && protocol != "http" && protocol != "https")
    throw ConfigError(fmt::format("cohort: --rdzv-conf protocol={} is neither http nor https", protocol));
  if (!protocol.empty())
    for (auto& e : list)
      if (!starts_with(e, "http://") && !starts_with(e, "https://")) e = protocol + "://" + e;
  auto file = [&](const char* key) {
    auto path = get(key);
    return path.empty() ? path : std::filesystem::absolute(path).string();
  };
  Certificates certificates{file("cacert"), file("cert"), file("key")};
  auto options = EtcdStoreOptions(std::move(list)).prefix("cohort/" + run_id + "/").certificates(certificates);
  if (auto user = get("user"); !user.empty()) {
    auto it = env.find(kEtcdPasswordVariable);
    if (it == env.end() || it->second.empty())
      throw ConfigError(fmt::format("cohort: --rdzv-conf user={} names an etcd user but {} is not set\n  fix: "
                                    "export {} with the user's etcd password",
                                    user, kEtcdPasswordVariable, kEtcdPasswordVariable));
    options.user(user).password(it->second);
  }
  validate(options);
  return options;
}

void validate(const EtcdStoreOptions& options) {
  if (options.endpoints().empty())
    throw ConfigError("cohort: etcd store given no endpoints\n  fix: name the etcd members' client addresses, "
                      "HOST:2379[,HOST:2379...]");
  for (const auto& e : options.endpoints())
    if (!etcd_host_port(e))
      throw ConfigError(fmt::format("cohort: etcd endpoint '{}' is not host:port (or http(s)://host:port)", e));
  if (options.prefix().empty())
    throw ConfigError("cohort: etcd store prefix is empty\n  fix: give each job a prefix of its own, e.g. "
                      "'cohort/<run id>/', so that jobs sharing the cluster stay apart");
  auto positive = [](std::chrono::milliseconds t, const char* name) {
    if (t.count() <= 0)
      throw ConfigError(fmt::format("cohort: etcd store {} must be > 0 (cohort bounds every wait)", name));
  };
  positive(options.timeout(), "timeout");
  positive(options.request_timeout(), "request_timeout");
  positive(options.connect_timeout(), "connect_timeout");
  positive(options.failover_timeout(), "failover_timeout");
  if (options.user().empty() && !options.password().empty())
    throw ConfigError("cohort: etcd password given without a user\n  fix: pass the etcd user too");
  const auto& c = options.certificates();
  if (c.cert_file.empty() != c.key_file.empty())
    throw ConfigError("cohort: etcd TLS needs both a client certificate and its key, or neither\n  fix: pass "
                      "the missing one");
}

const std::set<std::string>& etcd_conf_keys() {
  static const std::set<std::string> keys{"protocol", "cacert", "cert", "key", "user"};
  return keys;
}

std::map<std::string, std::string> etcd_worker_variables(const std::string& endpoints,
                                                         const std::map<std::string, std::string>& conf) {
  std::string items;
  for (const auto& [key, value] : conf) {
    if (!etcd_conf_keys().count(key)) continue;
    if (!items.empty()) items += ',';
    // The files as etcd_options_for_run resolves them: a worker may run elsewhere.
    const bool file = key == "cacert" || key == "cert" || key == "key";
    items += key + "=" + (file && !value.empty() ? std::filesystem::absolute(value).string() : value);
  }
  return {{"COHORT_AGENT_STORE", "etcd"}, {"COHORT_ETCD_ENDPOINTS", endpoints}, {"COHORT_ETCD_CONF", items}};
}

EtcdStoreOptions etcd_options_from_worker_env(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* name) {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  const auto endpoints = get("COHORT_ETCD_ENDPOINTS");
  if (endpoints.empty())
    throw ConfigError("COHORT_AGENT_STORE=etcd but COHORT_ETCD_ENDPOINTS is empty: start the program with `cohort "
                      "run --rdzv-backend etcd`, which sets both");
  std::map<std::string, std::string> conf;
  const auto items = get("COHORT_ETCD_CONF");
  std::size_t start = 0;
  while (start < items.size()) {
    auto comma = items.find(',', start);
    if (comma == std::string::npos) comma = items.size();
    const auto item = items.substr(start, comma - start);
    const auto eq = item.find('=');
    if (eq == std::string::npos || !etcd_conf_keys().count(item.substr(0, eq)))
      throw ConfigError(fmt::format("COHORT_ETCD_CONF: '{}' is not one of the etcd keys KEY=VALUE (protocol, "
                                    "cacert, cert, key, user)",
                                    item));
    conf[item.substr(0, eq)] = item.substr(eq + 1);
    start = comma + 1;
  }
  return etcd_options_for_run(endpoints, get("TORCHELASTIC_RUN_ID"), conf, env);
}

}  // namespace cohort::store
