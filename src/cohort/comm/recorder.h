#pragma once
// What comm tells whoever traces it. comm sits below trace: it defines this small
// interface and calls it, and trace::Timeline implements it (Note [Recording from
// below]). A World made with InitOptions().recorder(factory) hands the factory's
// recorder to every one of its groups, and DDP records its buckets on the group's.
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace cohort::comm {

class Group;

// Note [Recording from below]: the groups record each collective from launch to
// its wait, and DDP each bucket once its step is done, without knowing what keeps
// the events. Times are microseconds on the steady clock (steady_now_us()), the
// clock DDP's own timings use, so a recorder can place both on one track.
class Recorder {
 public:
  virtual ~Recorder() = default;
  // Whether events are kept now: cheap, so callers ask before building a name.
  virtual bool recording() const = 0;
  // A phase on the calling thread.
  virtual void span(std::string name, const char* category, double start_us, double end_us,
                    std::int64_t bytes = -1) = 0;
  virtual void instant(std::string name, const char* category, double at_us, std::int64_t bytes = -1) = 0;
  // An operation that may overlap others on its thread (a collective in flight, a
  // DDP bucket).
  virtual void async(std::string name, const char* category, double start_us, double end_us,
                     std::int64_t bytes = -1) = 0;
};

inline double steady_now_us() {
  using namespace std::chrono;
  return static_cast<double>(duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count()) / 1e3;
}

// Makes this rank's recorder once the world's group exists (a timeline aligns its
// clock to rank 0's over it); may return null for "record nothing".
using RecorderFactory = std::function<std::shared_ptr<Recorder>(Group& world_group, int rank, c10::Device device)>;

}  // namespace cohort::comm
