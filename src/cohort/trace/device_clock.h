#pragma once
// Times on a device's stream, for the timeline's device track (trace/timeline.h).
//
// Note [Device time on the host's clock]
// On a device that runs work asynchronously (CUDA), a call returns when its kernels
// are queued, so the host's clock around a phase or a collective says where the host
// waited, not where the device worked. A DeviceClock records marks on the device's
// current stream (timed CUDA events) and tells, once the device has reached a mark,
// when that was on the host's steady clock, the clock of every other event:
//  * An anchor is a mark the host waited for: recorded, then polled until reached.
//    It was reached between the last poll that found it pending (or its record) and
//    the poll that found it reached; the midpoint is taken, off by at most half that
//    interval (microseconds on an idle stream).
//  * A mark's host time is its anchor's plus the device's elapsed time from the
//    anchor to the mark. Marks are never waited for: the timeline asks each one
//    whether it has been reached when a step begins, and waits (bounded) only when
//    it writes its file.
//  * The device's timer and the host's clock drift apart slowly, so the timeline
//    takes a new anchor when its window of steps opens (TimelineOptions::first_step),
//    not only when the world is made. That wait lasts until the stream has run what
//    is queued on it, once per run.
//  * cudaEventElapsedTime gives float milliseconds: 24 bits, so a minute from the
//    anchor is good to about 4 us, an hour to about 0.2 ms. The timeline therefore
//    also takes a new anchor at a step boundary once the last is older than
//    TimelineOptions::device_anchor_every (a minute): a wait for the stream's queued
//    work once a minute.
// What a pair of marks means: a phase (trace::Span) from the stream reaching the
// phase's first kernel to it finishing its last; a collective from the stream
// reaching the launch (the backend's stream starts there, after the backend's
// earlier work) to the result being there. The end is marked on the clock's own
// stream made to wait for the backend (Work::synchronize() with that stream current:
// Recorder::device_mark_after; Pending::wait says when) rather than on the caller's
// stream, whose wait for the result sits behind the compute queued before wait():
// DDP waits for its buckets after all of backward is queued, and a mark there would
// end every bucket with backward. So a collective that ends before the compute
// around it was hidden behind it; one that ends after kept the stream waiting. An
// end is never drawn before the host called wait(): a mark cannot be reached before
// it is recorded.
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>

#include "cohort/comm/recorder.h"

namespace cohort::trace {

class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  virtual c10::Device device() const = 0;
  // A mark on the device's current stream (of the calling thread). May throw (a
  // device in error); Timeline turns that into no mark.
  virtual std::shared_ptr<comm::DeviceMark> mark() = 0;
  // Runs `wait` with a side stream of the device current, then marks that stream
  // (comm::Recorder::device_mark_after). May throw, as mark() may.
  virtual std::shared_ptr<comm::DeviceMark> mark_after(const std::function<void()>& wait) = 0;
  // Takes a new anchor: waits, at most `bound`, for the stream to run what is queued
  // on it. Throws cohort::TimeoutError naming the device when it does not; the old
  // anchor stays.
  virtual void anchor(std::chrono::milliseconds bound) = 0;
};

// A clock of timed c10::Events on `device`'s current stream (CUDA), anchored once
// before it returns. Throws cohort::Error saying why there is none: the CPU (its
// times are the host's), LibTorch 1.13 (whose events cannot be timed), a device
// whose backend has no events.
std::shared_ptr<DeviceClock> event_clock(c10::Device device, std::chrono::milliseconds anchor_bound);

}  // namespace cohort::trace
