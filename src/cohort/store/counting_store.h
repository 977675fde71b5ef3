#pragma once
// A c10d::Store that forwards to another and counts the calls made through it and
// the bytes of keys and values sent and received: what one client costs the store,
// seen from the client. The scale harness (benchmarks/scale/) and the tests that
// hold a protocol's cost to O(N) calls use it.
//
//   auto counted = c10::make_intrusive<cohort::store::CountingStore>(store);
//   ... ; counted->calls();
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cohort/compat/c10d.h"

namespace cohort::store {

class CountingStore : public c10d::Store {
 public:
  explicit CountingStore(c10::intrusive_ptr<c10d::Store> inner) : inner_(std::move(inner)) {
    c10d::Store::setTimeout(inner_->getTimeout());
  }

  using c10d::Store::compareSet;
  using c10d::Store::set;

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    count(key.size() + value.size());
    inner_->set(key, value);
  }
  std::vector<std::uint8_t> compareSet(const std::string& key, const std::vector<std::uint8_t>& expected,
                                       const std::vector<std::uint8_t>& desired) override {
    auto now = inner_->compareSet(key, expected, desired);
    count(key.size() + expected.size() + desired.size() + now.size());
    return now;
  }
  std::vector<std::uint8_t> get(const std::string& key) override {
    auto value = inner_->get(key);
    count(key.size() + value.size());
    return value;
  }
  std::int64_t add(const std::string& key, std::int64_t value) override {
    count(key.size() + 16);
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    count(key.size());
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    count(total(keys));
    return inner_->check(keys);
  }
  std::int64_t getNumKeys() override {
    count(8);
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    count(total(keys));
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    count(total(keys));
    inner_->wait(keys, timeout);
  }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    inner_->setTimeout(timeout);
    c10d::Store::setTimeout(timeout);
  }
#if COHORT_C10D_STORE_HAS_EXTENDED_API
  void append(const std::string& key, const std::vector<std::uint8_t>& value) override {
    count(key.size() + value.size());
    inner_->append(key, value);
  }
  std::vector<std::vector<std::uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    auto values = inner_->multiGet(keys);
    std::size_t bytes = total(keys);
    for (const auto& v : values) bytes += v.size();
    count(bytes);
    return values;
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<std::uint8_t>>& values) override {
    std::size_t bytes = total(keys);
    for (const auto& v : values) bytes += v.size();
    count(bytes);
    inner_->multiSet(keys, values);
  }
  bool hasExtendedApi() const override { return inner_->hasExtendedApi(); }
#endif
  virtual c10::intrusive_ptr<c10d::Store> clone() {  // NOLINT(modernize-use-override)
    return c10::make_intrusive<CountingStore>(inner_);
  }

  std::int64_t calls() const { return calls_.load(); }
  std::int64_t bytes() const { return bytes_.load(); }

 private:
  static std::size_t total(const std::vector<std::string>& keys) {
    std::size_t n = 0;
    for (const auto& k : keys) n += k.size();
    return n;
  }
  void count(std::size_t bytes) {
    ++calls_;
    bytes_ += static_cast<std::int64_t>(bytes);
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::atomic<std::int64_t> calls_{0};
  std::atomic<std::int64_t> bytes_{0};
};

}  // namespace cohort::store
