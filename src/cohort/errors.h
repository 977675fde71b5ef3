#pragma once
// cohort's typed errors. Users' mistakes (bad flags, bad environment, mismatched
// ranks) and failures of peers are exceptions whose message says what went wrong,
// where (rank, operation, flag) and how to fix it. Broken internal invariants use
// TORCH_INTERNAL_ASSERT instead and fail in every build type.
#include <stdexcept>
#include <string>
#include <vector>

namespace cohort {

// Base of every exception cohort throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The configuration is wrong: environment, options or flags. Fix it and rerun.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A bounded wait ran out. `missing_ranks` are the ranks known not to have arrived,
// empty when that could not be established.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& message, std::string operation,
               std::vector<int> missing_ranks)
      : Error(message),
        operation_(std::move(operation)),
        missing_ranks_(std::move(missing_ranks)) {}
  const std::string& operation() const noexcept { return operation_; }
  const std::vector<int>& missing_ranks() const noexcept { return missing_ranks_; }

 private:
  std::string operation_;
  std::vector<int> missing_ranks_;
};

// A collective failed for a reason other than a timeout, typically a peer that died.
class CommError : public Error {
 public:
  using Error::Error;
};

// A file's content is not what it should be: a dataset file that is missing,
// truncated or corrupt, or a checkpoint that fails its checksum. The message names the
// file and says how to get a good one.
class DataError : public Error {
 public:
  using Error::Error;
};

}  // namespace cohort
