#pragma once
// epoll for the store server's loop: each descriptor is registered once, under an
// id of the loop's choosing, with the events it wants now; wait() reports only the
// ready ones, so a wake-up costs what is ready, not what is open (Note [The loop's
// cost per wake-up] in store/server_loop.h).
//
//   Poller poller;
//   poller.add(fd, EPOLLIN, id);
//   std::vector<epoll_event> ready(256);
//   int n = poller.wait(ready, timeout_ms);  // ready[0..n).data.u64: the ids
#include <sys/epoll.h>

#include <cstdint>
#include <vector>

#include "cohort/store/net.h"

namespace cohort::store {

class Poller {
 public:
  // Throws CommError when the kernel gives no epoll instance.
  Poller();

  // False (errno set) when the kernel refuses the registration, e.g. at
  // fs.epoll.max_user_watches or out of memory: the caller drops that peer.
  bool add(int fd, std::uint32_t events, std::uint64_t id);
  // Changing or removing a registration that exists cannot fail but for a broken
  // invariant, so these throw CommError.
  void modify(int fd, std::uint32_t events, std::uint64_t id);
  void remove(int fd);

  // Up to ready.size() ready registrations into `ready`; 0 on a timeout or a signal.
  // timeout_ms as epoll_wait's: -1 waits without a bound.
  int wait(std::vector<epoll_event>& ready, int timeout_ms);

 private:
  net::Fd epoll_;
};

}  // namespace cohort::store
