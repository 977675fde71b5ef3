#include "support/subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace cohort::testing {
using Clock = std::chrono::steady_clock;

Subprocess::Subprocess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra_env)
    : start_(Clock::now()) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    auto name = entry.substr(0, entry.find('='));
    if (!extra_env.count(name)) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : extra_env) env_strings.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  auto argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  for (auto& e : env_strings) envp.push_back(e.data());
  args.push_back(nullptr);
  envp.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    setpgid(0, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

bool Subprocess::pump(std::chrono::milliseconds max_wait) {
  std::vector<pollfd> fds;
  if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
  if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
  if (fds.empty()) return false;
  if (poll(fds.data(), fds.size(), static_cast<int>(max_wait.count())) <= 0) return true;
  for (auto& p : fds) {
    if (!p.revents) continue;
    char buf[8192];
    ssize_t n = read(p.fd, buf, sizeof buf);
    auto& sink = p.fd == out_fd_ ? result_.out : result_.err;
    if (n > 0) {
      sink.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      close(p.fd);
      (p.fd == out_fd_ ? out_fd_ : err_fd_) = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool Subprocess::read_until(const std::function<bool(const std::string&)>& done, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!done(result_.out)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !pump(std::min(left, std::chrono::milliseconds(100)))) return done(result_.out);
  }
  return true;
}

ProcessResult Subprocess::finish(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      result_.timed_out = true;
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    if (!pump(std::min(left, std::chrono::milliseconds(50)))) {
      // Pipes closed: only the exit is left to wait for.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  reaped_ = true;
  // Drain what is left; a grandchild holding a pipe open must not stall us.
  auto drain_deadline = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < drain_deadline && pump(std::chrono::milliseconds(50))) {
  }
  if (WIFEXITED(status)) result_.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result_.signal = WTERMSIG(status);
  result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  return result_;
}

ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                          const std::map<std::string, std::string>& extra_env) {
  Subprocess p(argv, extra_env);
  return p.finish(timeout);
}

bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  auto close_paren = line.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < line.size() && line[close_paren + 2] == 'Z';
}

namespace {

// The kernel's ephemeral range, from which it draws the local port of every
// outgoing connection (and of bind to port 0).
std::pair<int, int> ephemeral_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768, high = 60999;
  in >> low >> high;
  return {low, high};
}

bool bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);  // free on every address, loopback included
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

}  // namespace

// Note [Test ports]: a port from bind(0) is in the ephemeral range, so between
// the pick and the agent's bind any outgoing connection on the machine (a Gloo
// pair, a store client, another test) may be given it as its local port, and the
// agent then finds it taken by a socket that is not listening. So ports are drawn
// at random below that range, checked free on every address, and reserved for
// this test process by a lock on a file named after the port: the lock goes with
// the process, so concurrent tests never share one and a crash leaks nothing.
int free_port() {
  // Below the ephemeral range where there is room, else above it.
  const auto [low, high] = ephemeral_range();
  int first = 12000, last = low - 1;
  if (last < first + 1000) {
    first = high + 1;
    last = 65535;
  }
  if (last < first + 1000)
    throw std::runtime_error("free_port: the ephemeral range " + std::to_string(low) + ".." + std::to_string(high) +
                             " (/proc/sys/net/ipv4/ip_local_port_range) leaves no room for test ports; narrow it");
  const std::string dir = "/tmp/cohort-test-ports";
  ::mkdir(dir.c_str(), 0777);
  std::random_device seed;
  std::mt19937 pick(seed() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> in_range(first, last);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = in_range(pick);
    const std::string path = dir + "/" + std::to_string(port);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !bindable(port)) {
      ::close(fd);
      continue;
    }
    return port;  // `fd` stays open: the reservation lasts as long as this process
  }
  throw std::runtime_error("free_port: no free port in " + std::to_string(first) + ".." + std::to_string(last));
}

}  // namespace cohort::testing
