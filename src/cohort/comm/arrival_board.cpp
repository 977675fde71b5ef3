#include "cohort/comm/arrival_board.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "cohort/util/bytes.h"

namespace cohort::comm {
namespace {

constexpr auto kTick = std::chrono::milliseconds(50);

std::int64_t unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

ArrivalBoard::ArrivalBoard(c10::intrusive_ptr<c10d::Store> store, std::string key_prefix,
                           std::vector<int> ranks, int self, std::chrono::milliseconds interval)
    : store_(std::move(store)),
      prefix_(std::move(key_prefix)),
      ranks_(std::move(ranks)),
      self_(self),
      interval_(interval) {
  publish_now();
  thread_ = std::thread([this] { publish_loop(); });
}

ArrivalBoard::~ArrivalBoard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string ArrivalBoard::key(int position) const {
  return prefix_ + std::to_string(ranks_[static_cast<size_t>(position)]);
}

std::int64_t ArrivalBoard::enter(const char* op) {
  std::lock_guard<std::mutex> lock(op_mu_);
  ++seq_;
  auto& slot = ops_[seq_ % kHistory];
  std::strncpy(slot, op, sizeof slot - 1);
  return seq_;
}

// "<seq> <unix ms> <op #seq> <op #seq-1> ..." (op names have no spaces).
void ArrivalBoard::publish_now() {
  std::string value;
  {
    std::lock_guard<std::mutex> lock(op_mu_);
    published_seq_ = seq_;
    value = std::to_string(seq_) + " " + std::to_string(unix_ms());
    for (std::int64_t s = seq_; s >= 0 && s > seq_ - kHistory; --s) value += std::string(" ") + ops_[s % kHistory];
  }
  try {
    store_->set(key(self_), util::to_bytes(value));
  } catch (const std::exception&) {
    // The store is gone (its host died). The collective that needs the peers will
    // fail on its own and report it; the board has nothing to add.
  }
}

void ArrivalBoard::publish_loop() {
  auto last = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Note [A broken group]: while a wait is in progress the thread wakes every
    // kBrokenPoll instead of every kTick.
    const bool watching = waiting_.load() > 0 && !has_broken_.load();
    if (cv_.wait_for(lock, watching ? kBrokenPoll : kTick, [&] { return stop_; })) return;
    if (watching) {
      lock.unlock();
      look_for_broken_mark();
      lock.lock();
    }
    auto now = std::chrono::steady_clock::now();
    bool moved;
    {
      std::lock_guard<std::mutex> op_lock(op_mu_);
      moved = seq_ != published_seq_;
    }
    if (!moved && now - last < interval_) continue;
    lock.unlock();
    publish_now();
    lock.lock();
    last = now;
  }
}

namespace {
const char* const kBrokenKey = "broken";
}

void ArrivalBoard::mark_broken(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.empty()) broken_ = why;
  }
  has_broken_ = true;
  try {
    store_->set(prefix_ + kBrokenKey, util::to_bytes(why));
  } catch (const std::exception&) {
    // The store is gone: the peers' own waits end at their timeouts, as before.
  }
}

std::string ArrivalBoard::broken() const {
  if (!has_broken_.load()) return {};
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

void ArrivalBoard::begin_wait() {
  ++waits_begun_;
  ++waiting_;
}

void ArrivalBoard::end_wait() { --waiting_; }

void ArrivalBoard::look_for_broken_mark() {
  // Only once the same waits have lasted a whole poll: most collectives end sooner,
  // and never reach the store.
  const auto begun = waits_begun_.load();
  const bool lasted = begun == waits_seen_;
  waits_seen_ = begun;
  if (!lasted) return;
  try {
    const auto key = prefix_ + kBrokenKey;
    if (!store_->check({key})) return;
    auto why = util::from_bytes(store_->get(key));
    {
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (broken_.empty()) broken_ = why.empty() ? std::string("a member marked the group broken") : why;
    }
    has_broken_ = true;
  } catch (const std::exception&) {
    // The store did not answer: the wait ends at its own timeout, as before.
  }
}

std::vector<PeerStatus> ArrivalBoard::diagnose(std::int64_t seq, const std::string& op) const {
  std::vector<PeerStatus> peers;
  const double stale_after = 3.0 * std::chrono::duration<double>(std::max(interval_, kTick)).count();
  // Each store call is bounded by the board connection's own timeout; one failure or
  // the overall deadline leaves the remaining peers kUnknown rather than waiting on.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool store_ok = true;
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    if (i == self_) continue;
    PeerStatus p;
    p.rank = ranks_[static_cast<size_t>(i)];
    if (!store_ok || std::chrono::steady_clock::now() >= deadline) {
      peers.push_back(p);
      continue;
    }
    try {
      if (!store_->check({key(i)})) {
        p.state = PeerStatus::State::kNeverSeen;
      } else {
        auto raw = store_->get(key(i));
        std::istringstream in(util::from_bytes(raw));
        std::int64_t when = 0;
        in >> p.seq >> when;
        std::vector<std::string> history;  // history[k] is what it called as #(p.seq - k)
        for (std::string name; in >> name;) history.push_back(name);
        if (!history.empty()) p.op = history.front();
        p.seconds_since_heartbeat = static_cast<double>(unix_ms() - when) / 1000.0;
        const auto back = static_cast<std::size_t>(p.seq - seq);
        if (p.seq >= seq && back < history.size() && history[back] != op) {
          p.state = PeerStatus::State::kElsewhere;
          p.op_at_seq = history[back];
        } else if (p.seq >= seq) {
          p.state = PeerStatus::State::kArrived;
        } else if (p.seconds_since_heartbeat > stale_after) {
          p.state = PeerStatus::State::kSilent;
        } else {
          p.state = PeerStatus::State::kBehind;
        }
      }
    } catch (const std::exception&) {
      p.state = PeerStatus::State::kUnknown;
      store_ok = false;
    }
    peers.push_back(p);
  }
  return peers;
}

std::vector<int> ArrivalBoard::missing(const std::vector<PeerStatus>& peers) {
  std::vector<int> out;
  for (const auto& p : peers)
    if (p.state != PeerStatus::State::kArrived && p.state != PeerStatus::State::kUnknown)
      out.push_back(p.rank);
  return out;
}

std::string ArrivalBoard::describe(const std::vector<PeerStatus>& peers) {
  std::ostringstream out;
  char age[32];
  bool first = true;
  for (const auto& p : peers) {
    if (p.state == PeerStatus::State::kArrived) continue;
    if (!first) out << "; ";
    first = false;
    out << "rank " << p.rank;
    std::snprintf(age, sizeof age, "%.1f", p.seconds_since_heartbeat);
    switch (p.state) {
      case PeerStatus::State::kElsewhere:
        out << " (called " << p.op_at_seq << " as that collective)";
        break;
      case PeerStatus::State::kBehind:
        out << " (alive, but still at " << p.op << " #" << p.seq << ")";
        break;
      case PeerStatus::State::kSilent:
        out << " (no heartbeat for " << age << " s, last at " << p.op << " #" << p.seq
            << ": the process died or is frozen)";
        break;
      case PeerStatus::State::kNeverSeen:
        out << " (never joined this group: it did not start, or died before its first collective)";
        break;
      default:
        out << " (state unknown: the store did not answer)";
    }
  }
  return out.str();
}

std::string ArrivalBoard::explain(int self, const std::string& op, std::int64_t seq,
                                  const std::vector<PeerStatus>& peers) {
  std::string elsewhere;
  std::vector<PeerStatus> others;  // not arrived for another reason
  for (const auto& p : peers) {
    if (p.state == PeerStatus::State::kElsewhere)
      elsewhere += ", rank " + std::to_string(p.rank) + " in " + p.op_at_seq + " #" + std::to_string(seq);
    else if (p.state != PeerStatus::State::kArrived)
      others.push_back(p);
  }
  if (!elsewhere.empty()) {
    std::string out = "ranks called different collectives: rank " + std::to_string(self) + " in " + op + " #" +
                      std::to_string(seq) + elsewhere;
    if (!others.empty()) out += "; not arrived: " + describe(others);
    return out;
  }
  if (!others.empty()) return "not arrived: " + describe(others);
  return "every rank reached it, so the transport stalled: check the network between the hosts (firewall, "
         "GLOO_SOCKET_IFNAME)";
}

}  // namespace cohort::comm
