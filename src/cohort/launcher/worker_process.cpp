#include "cohort/launcher/worker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cohort/errors.h"

namespace cohort::launcher {
namespace {

// The soft RLIMIT_NOFILE before raise_open_files_limit(); RLIM_INFINITY: not raised.
rlim_t g_original_soft_nofile = RLIM_INFINITY;

void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("cohort run: pipe: ") + std::strerror(errno));
}

#ifndef SYS_close_range
#define SYS_close_range 436  // the same number on every architecture
#endif

// Note [Closing descriptors]
// A worker inherits no descriptor but stdin, stdout and stderr, as under torchrun
// (close_fds): LibTorch's TCPStore opens pipes without close-on-exec, and a worker
// holding them keeps the launcher's store plumbing alive. Between fork and exec,
// everything above 2 is closed except `keep` (the exec status pipe, which closes
// itself at exec): with close_range (Linux 5.9), else one close() per descriptor up
// to the descriptor limit. Both are async-signal-safe.
void close_inherited_fds(int keep) {
  rlimit limit{};
  int top = 65535;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur <= (1u << 30))
    top = static_cast<int>(limit.rlim_cur) - 1;
  auto close_from = [top](int first, int last) {  // last < 0: every descriptor from first on
    if (first > last && last >= 0) return;
    const unsigned to = last < 0 ? ~0u : static_cast<unsigned>(last);
    if (syscall(SYS_close_range, static_cast<unsigned>(first), to, 0u) == 0) return;
    for (int fd = first; fd <= (last < 0 ? top : last); ++fd) close(fd);
  };
  if (keep < 3) return close_from(3, -1);
  close_from(3, keep - 1);
  close_from(keep + 1, -1);
}

// The launcher's end of the reaper's socket pair; -1 while no reaper runs (tests,
// or a fork that failed: the workers then still have PDEATHSIG).
int g_reaper_fd = -1;
pid_t g_reaper_pid = -1;  // the reaper's pid, as its parent reported it; -1: unknown

// What the reaper remembers: the process groups of the workers that run. Static, so
// that the reaper (a fork of a multithreaded launcher) allocates nothing.
constexpr int kReaperSlots = 1 << 16;
pid_t g_reaper_groups[kReaperSlots];

[[noreturn]] void run_reaper(int in) {
  // Async-signal-safe calls only from here on.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) signal(s, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_NAME, "cohort-reaper");
  // Nothing of the launcher's: its console pipes (Note [Never stalled by the
  // console]) must see their end when the launcher exits.
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd)
    if (devnull >= 0) dup2(devnull, fd);
  close_inherited_fds(in);
  int used = 0;
  for (;;) {
    std::int32_t message = 0;
    ssize_t n = read(in, &message, sizeof message);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof message)) break;  // the launcher is gone (EOF)
    if (message > 0) {
      if (used < kReaperSlots) g_reaper_groups[used++] = message;
    } else {
      for (int i = 0; i < used; ++i)
        if (g_reaper_groups[i] == -message) g_reaper_groups[i--] = g_reaper_groups[--used];
    }
  }
  for (int i = 0; i < used; ++i) kill(-g_reaper_groups[i], SIGKILL);
  _exit(0);
}

void tell_reaper(std::int32_t message) {
  if (g_reaper_fd < 0) return;
  ssize_t n;
  do {
    n = send(g_reaper_fd, &message, sizeof message, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {  // no reaper (it could not be forked): PDEATHSIG alone, as before
    close(g_reaper_fd);
    g_reaper_fd = -1;
  }
}

[[noreturn]] void exec_child(pid_t parent, int out_w, int err_w, int status_w, char* const* argv, char* const* envp) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
  // Signals are blocked (see spawn); restore the defaults before letting them in, so
  // none reaches the launcher's handler, which shares the launcher's self-pipe.
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) signal(s, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  dup2(out_w, STDOUT_FILENO);
  dup2(err_w, STDERR_FILENO);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);  // dup2 clears CLOEXEC on fd 0 only
  close_inherited_fds(status_w);  // Note [Closing descriptors]
  if (g_original_soft_nofile != RLIM_INFINITY) {  // Note [Open files limit]
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
      limit.rlim_cur = g_original_soft_nofile;
      setrlimit(RLIMIT_NOFILE, &limit);
    }
  }
  execve(argv[0], argv, envp);
  int err = errno;
  ssize_t ignored = write(status_w, &err, sizeof err);
  (void)ignored;
  _exit(127);
}

}  // namespace

WorkerProcess WorkerProcess::spawn(const SpawnRequest& request) {
  std::vector<std::string> arg_strings{request.program};
  arg_strings.insert(arg_strings.end(), request.args.begin(), request.args.end());
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : request.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (auto& s : arg_strings) argv.push_back(s.data());
  for (auto& s : env_strings) envp.push_back(s.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  int out[2], err[2], status[2];
  make_pipe(out);
  make_pipe(err);
  make_pipe(status);
  pid_t parent = getpid();
  sigset_t all, previous;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &previous);
  pid_t pid = fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]}) close(fd);
    throw Error(std::string("cohort run: fork: ") + std::strerror(errno));
  }
  if (pid == 0) exec_child(parent, out[1], err[1], status[1], argv.data(), envp.data());
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  // Also set the group from this side, so that signal_group works even before the
  // child has run (the usual race-free idiom; one of the two calls wins).
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  close(status[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(status[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n > 0) {
    waitpid(pid, nullptr, 0);
    close(out[0]);
    close(err[0]);
    throw Error("cohort run: could not execute " + request.program + ": " + std::strerror(exec_errno));
  }
  tell_reaper(pid);  // Note [No orphans]
  WorkerProcess w;
  w.pid_ = pid;
  w.out_fd_ = out[0];
  w.err_fd_ = err[0];
  return w;
}

void WorkerProcess::release_group() const {
  if (pid_ > 0) tell_reaper(-pid_);
}

void WorkerProcess::signal_group(int signal) const {
  // The group exists from fork on (both sides call setpgid), and its id cannot be
  // reused while any member lives, so this never hits a stranger, even after the
  // worker itself has been reaped.
  if (pid_ > 0) kill(-pid_, signal);
}

void start_orphan_reaper() {
  if (g_reaper_fd >= 0) return;
  // A socket pair: one message per read, and send()'s MSG_NOSIGNAL (no SIGPIPE if the
  // reaper is gone).
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return;
  sigset_t all, previous;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &previous);
  // Forked twice, so that the reaper is nobody's child here: the launcher's children
  // are its workers (tests and tools that list them stay right).
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[1]);  // the launcher's end: else the reaper would never see it close
    const pid_t reaper = fork();
    if (reaper == 0) run_reaper(fds[0]);
    // Tell the launcher whom to wait for in stop_orphan_reaper(); it reads this once
    // this process has exited, so the message is there by then.
    if (reaper > 0 && send(fds[0], &reaper, sizeof reaper, MSG_NOSIGNAL) != sizeof reaper) _exit(1);
    _exit(0);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    return;
  }
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_t reaper = -1;
  if (recv(fds[1], &reaper, sizeof reaper, MSG_DONTWAIT) == sizeof reaper) g_reaper_pid = reaper;
  g_reaper_fd = fds[1];
}

namespace {
// Whether process `pid` still runs: it exists and is not a zombie.
bool reaper_alive(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* name_end = std::strrchr(buf, ')');
  return name_end && name_end[1] == ' ' && name_end[2] != 'Z' && name_end[2] != 'X';
}
}  // namespace

void stop_orphan_reaper() {
  if (g_reaper_fd < 0) return;
  // Our end stops writing: the reaper reads its end of file, kills any group it still
  // holds, and exits, which closes its end; wait for that (bounded), so that a job
  // leaves no process of its own behind once `cohort run` has returned.
  shutdown(g_reaper_fd, SHUT_WR);
  pollfd gone{g_reaper_fd, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int ready = poll(&gone, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char byte;
    const ssize_t n = recv(g_reaper_fd, &byte, sizeof byte, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;  // its end closed: it has exited
  }
  close(g_reaper_fd);
  g_reaper_fd = -1;
  // Its end closes while it exits, a moment before the process is gone: wait for
  // that too (a zombie, waiting for init to reap it, counts as gone).
  while (g_reaper_pid > 0 && reaper_alive(g_reaper_pid) && std::chrono::steady_clock::now() < deadline)
    usleep(2000);
  g_reaper_pid = -1;
}

rlim_t raise_open_files_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return RLIM_INFINITY;
  if (limit.rlim_cur == limit.rlim_max) return limit.rlim_cur;
  const rlim_t original = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return original;  // e.g. a hard limit above fs.nr_open
  if (g_original_soft_nofile == RLIM_INFINITY) g_original_soft_nofile = original;
  return limit.rlim_cur;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return std::string("signal SIG") + (abbrev ? abbrev : "?") + " (" + std::to_string(sig) + ")";
  }
  return "status " + std::to_string(status);
}

}  // namespace cohort::launcher
