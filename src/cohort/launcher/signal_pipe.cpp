#include "cohort/launcher/signal_pipe.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cohort::launcher {

int pending_signal(int signal_fd) {
  if (signal_fd < 0) return 0;
  // Drains the pipe: SIGCHLD bytes (a worker exited) are not requests to stop, and
  // one left unread would wake the next wait at once for nothing.
  unsigned char sigs[64];
  int stop = 0;
  ssize_t n;
  while ((n = read(signal_fd, sigs, sizeof sigs)) > 0)
    for (ssize_t i = 0; i < n; ++i)
      if (sigs[i] != SIGCHLD && stop == 0) stop = sigs[i];
  return stop;
}

int wait_for_signal(int signal_fd, std::chrono::milliseconds how_long) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + how_long;
  while (true) {
    if (int sig = pending_signal(signal_fd)) return sig;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p{signal_fd, POLLIN, 0};
    // A pipe that is not there (-1) is ignored by poll, which then just times out.
    if (poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR) return 0;
  }
}

}  // namespace cohort::launcher
