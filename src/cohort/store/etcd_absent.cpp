// make_etcd_store and delete_etcd_prefix in a build without the etcd store
// (COHORT_WITH_ETCD=OFF, for a kit with no libcurl): a clear refusal, so that a
// launcher or worker asked for etcd says what to rebuild instead of failing to link.
#include "cohort/errors.h"
#include "cohort/store/etcd_options.h"

namespace cohort::store {
namespace {

[[noreturn]] void absent() {
  throw ConfigError("cohort: this build has no etcd store (it was configured with -DCOHORT_WITH_ETCD=OFF)\n  fix: "
                    "install libcurl's development files (libcurl4-openssl-dev) and configure cohort with "
                    "-DCOHORT_WITH_ETCD=ON, or use --rdzv-backend c10d");
}

}  // namespace

c10::intrusive_ptr<c10d::Store> make_etcd_store(const EtcdStoreOptions&) { absent(); }
std::int64_t delete_etcd_prefix(const EtcdStoreOptions&) { absent(); }
bool delete_etcd_prefix_if(const EtcdStoreOptions&, const std::string&, const std::vector<std::uint8_t>&) {
  absent();
}

}  // namespace cohort::store
