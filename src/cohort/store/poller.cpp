#include "cohort/store/poller.h"

#include <errno.h>

#include <cstring>

#include <fmt/format.h>

#include "cohort/errors.h"

namespace cohort::store {

Poller::Poller() : epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (!epoll_) throw CommError(fmt::format("cohort: the store could not make its epoll instance: {}", std::strerror(errno)));
}

bool Poller::add(int fd, std::uint32_t events, std::uint64_t id) {
  epoll_event e{};
  e.events = events;
  e.data.u64 = id;
  return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e) == 0;
}

void Poller::modify(int fd, std::uint32_t events, std::uint64_t id) {
  epoll_event e{};
  e.events = events;
  e.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &e) != 0)
    throw CommError(fmt::format("cohort: the store's loop could not change descriptor {}'s events: {} (a bug in "
                                "cohort: please report it)",
                                fd, std::strerror(errno)));
}

void Poller::remove(int fd) {
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr) != 0)
    throw CommError(fmt::format("cohort: the store's loop could not forget descriptor {}: {} (a bug in cohort: "
                                "please report it)",
                                fd, std::strerror(errno)));
}

int Poller::wait(std::vector<epoll_event>& ready, int timeout_ms) {
  int n = ::epoll_wait(epoll_.get(), ready.data(), static_cast<int>(ready.size()), timeout_ms);
  if (n >= 0) return n;
  if (errno == EINTR) return 0;
  throw CommError(fmt::format("cohort: the store's loop failed in epoll_wait(): {}", std::strerror(errno)));
}

}  // namespace cohort::store
