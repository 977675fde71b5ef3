#pragma once
// Whether every rank's backward completed a synchronised step. The reducer launches
// this tiny all-reduce once per synchronised step, after its last bucket, so that
// a rank whose backward completed learns that a peer's failed (its buckets then
// hold a partial average) instead of applying it.
//
// Note [A step that failed]
// A backward can throw part-way (a hook that skips a batch, an out-of-memory), and
// training loops catch it and go on. By then some buckets' reductions have started
// on this rank and are matched, by order, with the peers' collectives. Dropping
// them would let the next step's gradient copies race with reductions still
// writing into the same buckets, and leave the ranks' collective sequences out of
// step. So a synchronised step is always *closed* with the same collectives on
// every rank: every bucket, in plan order, then this status.
//  * A rank whose backward completed closes it at the end of backward, as usual.
//  * A rank whose backward failed after some gradient arrived closes it at the
//    start of its next DDP forward (any forward, with or without grad): it launches
//    the buckets its backward did not reach (their contents are never used), sets
//    its slot of the status, and waits for everything, bounded by the group's
//    timeout. Buckets are reused only after that wait. With bucket views, .grad is
//    bucket memory that those reductions wrote into, perhaps after the training
//    loop zeroed it: it is zeroed again once they are done.
//  * Every rank then reads the status. Where some rank failed, the step's averages
//    are discarded on every rank: a rank whose backward completed throws CommError
//    naming the failed ranks from its backward (skip the step there too), and no
//    .grad is written. The next step synchronises exactly.
// A backward that fails before any parameter's gradient arrived cannot be told
// from a forward that had no backward: nothing of it is closed. If the peers
// completed that step, they time out in it, naming this rank.
// The cost: one all-reduce of world-size ints per synchronised step, launched after
// the last bucket, so it rides behind the gradients' communication; or nothing
// where it rides in the last bucket (Note [The status rides in the last bucket]).
//
// Note [The status rides in the last bucket]
// A collective of its own costs a hand-off to a Gloo thread and a round trip per
// step: at world 2 on 2 cores, 4-10 % of a step (issue 33). So where DDP uses its
// default all-reduce hook and the last bucket holds float32 or float64, the status
// is world-size extra elements at the end of that bucket: each rank writes its slot
// and zeros, and the bucket's sum (a plain sum: Note [Divide on the way in])
// carries every rank's slot exactly, as integers below 2^24 are exact in float32.
// Slots hold (step mod 2^22) * 2 + failed, so step numbers are compared modulo
// 2^22, and an error names them so. The last bucket then waits for the status:
// it is launched at the end of backward (or when a failed step is closed) rather
// than as soon as its last gradient arrives, which is at most the tail of backward
// after the first layers' gradients. Every rank decides the same (same hook, same
// dtypes, same world), so collectives stay paired. A custom hook may transform the
// bucket (compress, project), so it keeps the separate all-reduce.
//
// Note [Steps that pair]
// Collectives pair by order, not by step. A rank whose training forward got no
// DDP backward (its loss ignored the outputs) treats it as a forward without
// backward and goes on to the next step alone: its next step's buckets then pair
// with its peers' buckets of this one. The sizes agree, so Gloo does not notice,
// and every rank would average one step's gradients with another's (or, where a
// bucket met a collective of another size, Gloo aborts the process). So each
// rank's slot of the status also carries its step number (forwards with grad
// enabled outside no_sync, mirrored ones under join included), and where they
// differ wait() throws CommError on every rank, naming each rank's step: the
// averages are discarded, as for a failed step.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "cohort/comm/group.h"

namespace cohort::ddp {

class StepStatus {
 public:
  StepStatus(comm::Group group, c10::Device device);

  // Launches this rank's part; `failed` is whether its backward failed, `step` is
  // the step it closes (Note [Steps that pair]). A group of one has no peer to
  // tell, and launches nothing.
  // Riding (Note [The status rides in the last bucket]), launch only writes this
  // rank's slot into the bucket; the caller reduces the bucket.
  void launch(bool failed, std::uint64_t step = 0);
  bool launched() const { return launched_; }
  // Rides in `slots` (world-size elements at the end of the last bucket) from now
  // on; an undefined tensor goes back to a collective of its own.
  void ride_on(at::Tensor slots);
  bool rides() const { return slots_.defined(); }
  // Waits (bounded); the group ranks whose backward failed, ascending. Throws
  // CommError where the ranks closed different steps (Note [Steps that pair]).
  // Riding, the caller has waited for the bucket first.
  std::vector<int> wait();
  // Forgets a launched status without waiting (the group is broken anyway).
  void drop();

 private:
  comm::Group group_;
  at::Tensor flags_;  // one int per rank
  at::Tensor slots_;  // riding: the last bucket's tail
  comm::Pending work_;
  bool launched_ = false;
};

// Pure: the ranks whose slot is set in a summed status (any dtype holding whole numbers).
std::vector<int> failed_ranks(const at::Tensor& summed);
// Pure: each rank's step in a summed status.
std::vector<std::uint64_t> status_steps(const at::Tensor& summed);

}  // namespace cohort::ddp
