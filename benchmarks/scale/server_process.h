#pragma once
// The store benchmark's server in a child process (the benchmark's own binary in
// --serve mode), so that the clients' threads do not share its process, and so that
// its CPU time can be read apart from theirs.
//
// Note [The --serve protocol]: the child prints one line, "port P backend B", once it
// listens. Then each line "cpu" on its stdin is answered with its CPU time so far in
// microseconds, "USER_PLUS_SYSTEM SYSTEM", and the end of its stdin (the parent closing it, or
// dying) makes it exit. Every read here is bounded by the timeout given.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cohort::bench {

class ServerProcess {
 public:
  // Starts `argv` (argv[0]: the program's path) and waits up to `timeout` for it to listen.
  ServerProcess(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) : timeout_(timeout) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("pipe2(): ") + std::strerror(errno));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error(std::string("fork(): ") + std::strerror(errno));
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    try {
      std::istringstream line(read_line("to listen"));
      std::string word_port, word_backend;
      line >> word_port >> port_ >> word_backend >> backend_;
      if (word_port != "port" || word_backend != "backend" || port_ <= 0)
        throw std::runtime_error("the store server process did not say its port");
    } catch (...) {
      stop();
      throw;
    }
  }

  ~ServerProcess() { stop(); }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  const std::string& backend() const { return backend_; }

  struct CpuTime {
    double total = 0;   // user + system, in microseconds
    double system = 0;  // in the kernel
  };
  // The server's CPU time so far.
  CpuTime cpu_us() {
    const char ask[] = "cpu\n";
    if (::write(to_child_, ask, sizeof ask - 1) != static_cast<ssize_t>(sizeof ask - 1))
      throw std::runtime_error("the store server process is gone");
    CpuTime t;
    std::istringstream(read_line("for its CPU time")) >> t.total >> t.system;
    return t;
  }

 private:
  // Ends its stdin, so that it exits; after 10 s, kills it.
  void stop() {
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
    to_child_ = from_child_ = -1;
    if (pid_ <= 0) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }

  std::string read_line(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      if (auto end = buffered_.find('\n'); end != std::string::npos) {
        std::string line = buffered_.substr(0, end);
        buffered_.erase(0, end + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{from_child_, POLLIN, 0};
      const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0)
        throw std::runtime_error(std::string("waited ") + std::to_string(timeout_.count()) +
                                 " ms for the store server process " + what);
      char chunk[256];
      const ssize_t got = ::read(from_child_, chunk, sizeof chunk);
      if (got <= 0) throw std::runtime_error(std::string("the store server process exited while waiting ") + what);
      buffered_.append(chunk, static_cast<std::size_t>(got));
    }
  }

  std::chrono::milliseconds timeout_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  int port_ = 0;
  std::string backend_;
  std::string buffered_;
};

}  // namespace cohort::bench
