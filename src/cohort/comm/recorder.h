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
#include <optional>
#include <string>

namespace cohort::comm {

class Group;

// A point recorded on a device's stream (Note [Device time on the host's clock] in
// trace/device_clock.h). Marks on a device that runs work asynchronously (CUDA) say
// when the device got there, which the host's clock at the call cannot.
class DeviceMark {
 public:
  virtual ~DeviceMark() = default;
  // When the device reached this mark, in steady_now_us() microseconds; nullopt
  // while it has not. Never blocks.
  virtual std::optional<double> reached_us() = 0;
};

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

  // A mark on `device`'s current stream, when this recorder keeps device times for
  // that device and is recording; else null (the default: host times only). Never
  // throws: a device that fails to record gives null.
  virtual std::shared_ptr<DeviceMark> device_mark(c10::Device /*device*/) { return nullptr; }
  // A mark that `device` reaches once an operation's result is there: `wait_again`
  // (the operation's Work::synchronize()) queues a wait for the result on the current
  // stream; it runs with a side stream current and the mark goes on that stream, so
  // that the caller's stream and its queued work do not delay it (Pending::wait says
  // when). Null when not recording (the default). Never throws.
  virtual std::shared_ptr<DeviceMark> device_mark_after(c10::Device /*device*/,
                                                        const std::function<void()>& /*wait_again*/) {
    return nullptr;
  }
  // An operation from one mark to another, as the device ran it (a collective from
  // the stream reaching its launch to its result being there). Kept until the device
  // has reached both marks.
  virtual void device_async(std::string /*name*/, const char* /*category*/, std::shared_ptr<DeviceMark> /*start*/,
                            std::shared_ptr<DeviceMark> /*end*/, std::int64_t /*bytes*/ = -1) {}
};

inline double steady_now_us() {
  using namespace std::chrono;
  return static_cast<double>(duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count()) / 1e3;
}

// Makes this rank's recorder once the world's group exists (a timeline aligns its
// clock to rank 0's over it); may return null for "record nothing".
using RecorderFactory = std::function<std::shared_ptr<Recorder>(Group& world_group, int rank, c10::Device device)>;

}  // namespace cohort::comm
