#pragma once
// Runs a child process for tests, with every wait bounded: a child that outlives its
// deadline is killed (with its process group) and reported as timed out.
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace cohort::testing {

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string out;
  std::string err;
  double seconds = 0;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with this process's environment plus `extra_env`.
  Subprocess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra_env = {});
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `done(out_so_far)` holds or the deadline passes; returns
  // whether it held.
  bool read_until(const std::function<bool(const std::string&)>& done, std::chrono::milliseconds timeout);
  // Waits for the exit, killing the child at the deadline.
  ProcessResult finish(std::chrono::milliseconds timeout);
  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }

 private:
  bool pump(std::chrono::milliseconds max_wait);  // false once both pipes closed
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool reaped_ = false;
  std::chrono::steady_clock::time_point start_;
  ProcessResult result_;
};

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                          const std::map<std::string, std::string>& extra_env = {});

// Whether `pid` is gone (or a zombie nobody has reaped yet).
bool process_gone(pid_t pid);

// A TCP port, free on every address and reserved for this process, outside the
// kernel's ephemeral range (Note [Test ports]).
int free_port();

}  // namespace cohort::testing
