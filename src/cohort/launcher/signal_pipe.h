#pragma once
// The launcher's signals as its waits see them. agent.cpp's handler writes one byte
// per signal to a self-pipe; every wait of the agents (worker groups, the
// rendezvous, the pause between restarts, the linger of the store's host) reads
// that pipe, so Ctrl-C ends any of them promptly with 128+N.
#include <chrono>

namespace cohort::launcher {

// Thrown by a wait's check when the launcher was signalled; the agent catches it,
// stops what runs and exits 128+sig.
struct SignalReceived {
  int sig;
};

// The first signal waiting in the pipe (SIGCHLD aside), or 0; the pipe is drained.
// Never blocks.
int pending_signal(int signal_fd);

// Waits up to `how_long` for a signal (SIGCHLD aside); returns it, or 0 when the
// time ran out. Woken at once by a signal: it polls the pipe, it does not sleep.
int wait_for_signal(int signal_fd, std::chrono::milliseconds how_long);

}  // namespace cohort::launcher
