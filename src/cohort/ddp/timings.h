#pragma once
// When each bucket of one DDP iteration became ready, was launched and finished,
// for the overlap benchmark. Seconds since the iteration's forward ended
// (prepare for backward). Recorded only with record_timings(true).
#include <cstdint>
#include <vector>

namespace cohort::ddp {

struct BucketTiming {
  std::int64_t bytes = 0;
  double ready_s = -1;     // its last gradient arrived
  double launched_s = -1;  // its reduction started (later than ready_s when an earlier bucket was late)
  double done_s = -1;      // first seen complete (checked at every gradient arrival and at the end)
};

struct IterationTimings {
  double backward_end_s = -1;  // autograd finished; DDP starts waiting
  double finalize_end_s = -1;  // every bucket reduced and copied back
  std::vector<BucketTiming> buckets;  // in launch order
  // Share of the communication window (first launch .. last done) that lies before
  // the end of backward, i.e. hidden behind computation. 1 when nothing was sent.
  double hidden_fraction() const;
};

}  // namespace cohort::ddp
