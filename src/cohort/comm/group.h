#pragma once
// A process group: a set of ranks that run collectives together. Every operation is
// bounded by the group's timeout; a timeout throws cohort::TimeoutError naming this
// rank, the operation and the ranks that did not arrive (Note [Arrival board]).
//
// A Group is a handle: copies share one underlying c10d backend. Ranks passed to and
// returned from a Group are *group* ranks (0..size()-1); global_ranks() maps them.
//
//   auto& g = world.group();
//   auto t = torch::ones({4}) * g.rank();
//   g.all_reduce(t);                    // sum over ranks, in place
//   auto parts = g.all_gather(t);       // size() tensors
#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/recorder.h"
#include "cohort/comm/reduce_op.h"
#include "cohort/compat/c10d.h"

namespace cohort::comm {

class ArrivalBoard;
struct GroupState;

// An operation in flight. wait() is bounded by the group's timeout and throws
// TimeoutError/CommError with a diagnosis; it is a no-op the second time. Always
// wait(): an all_reduce with kAvg divides by the group size inside wait(), so until
// then (even once is_completed() is true) the tensor holds the sum.
class Pending {
 public:
  Pending() = default;
  void wait();
  bool is_completed() const;

 private:
  friend class Group;
  Pending(std::shared_ptr<GroupState> group, c10::intrusive_ptr<compat::Work> work,
          const char* op, std::int64_t seq, std::function<void()> finish, double started_us, std::int64_t bytes,
          std::optional<c10::Device> device, std::shared_ptr<DeviceMark> device_start);
  std::shared_ptr<GroupState> group_;
  c10::intrusive_ptr<compat::Work> work_;
  const char* op_ = "";
  std::int64_t seq_ = 0;
  std::function<void()> finish_;  // runs after a successful wait (e.g. divide for kAvg)
  double started_us_ = -1;         // on the group's recorder; < 0 when not recorded
  std::int64_t bytes_ = -1;
  std::optional<c10::Device> device_;       // where the op's tensors are
  std::shared_ptr<DeviceMark> device_start_;  // on device_'s stream at launch; null when not recorded
};

class Group {
 public:
  // A non-member's handle, as returned by World::new_group on ranks outside it.
  Group() = default;
  explicit Group(std::shared_ptr<GroupState> state) : state_(std::move(state)) {}

  bool is_member() const { return state_ != nullptr; }
  int rank() const;
  int size() const;
  const std::vector<int>& global_ranks() const;
  const std::string& name() const;
  std::string backend_name() const;
  std::chrono::milliseconds timeout() const;

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  Pending all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // The reduction of `tensor` over the ranks lands in root's tensor (`root` is a group
  // rank); the others' tensors are left unspecified. Sum, min, max or product (kAvg:
  // use kSum and divide, as Gloo has no average).
  Pending reduce_async(at::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum);
  // `root` is a group rank.
  void broadcast(at::Tensor& tensor, int root = 0);
  Pending broadcast_async(at::Tensor& tensor, int root = 0);
  // One tensor per group rank, in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  // `parts` gets size() tensors at once; they hold the result after wait().
  Pending all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& parts);
  // Gathers into `parts` (size() tensors shaped as `tensor`, e.g. views of one flat
  // buffer) instead of new ones.
  Pending all_gather_into_async(const at::Tensor& tensor, std::vector<at::Tensor> parts);
  // `input`'s first dimension is split into size() equal chunks; returns the reduction
  // of chunk rank() over all ranks.
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op = ReduceOp::kSum);
  // The sum of chunk rank() of `input` over the ranks lands in `output` (contiguous,
  // one chunk's size) after wait(). `input` is scratch: its contents are unspecified
  // afterwards. Gloo has no reduce-scatter in every LibTorch we support, so there it
  // is an all-reduce of `input` whose chunk is copied out.
  Pending reduce_scatter_async(at::Tensor& input, at::Tensor& output);
  void barrier();
  void send(const at::Tensor& tensor, int dst, int tag = 0);
  void recv(at::Tensor& tensor, int src, int tag = 0);
  // Point-to-point without waiting: keep `tensor` alive and unchanged until wait().
  // A send may not complete before the peer posts the matching recv (Gloo waits for
  // it), so a rank that sends and then receives should send asynchronously.
  Pending send_async(const at::Tensor& tensor, int dst, int tag = 0);
  Pending recv_async(at::Tensor& tensor, int src, int tag = 0);

  // The c10d backend, for library code (DDP) that drives it directly. Use
  // track() so that timeouts stay diagnosable (and the operation is traced).
  compat::Backend& backend() const;
  Pending track(c10::intrusive_ptr<compat::Work> work, const char* op, std::int64_t bytes = -1);
  // What this group records its operations on (comm/recorder.h); null when nothing
  // records.
  Recorder* recorder() const;

 private:
  GroupState& checked(const char* op) const;
  // Records the op on the arrival board, issues it, and wraps it for a bounded wait.
  // `checkable`: not yet issued and group-wide (Note [Checked collectives]).
  // `device`: where the op's tensors are, for the recorder's device marks (none when
  // nullopt).
  Pending launch(const char* op, std::optional<c10::Device> device, std::int64_t bytes,
                 const std::function<c10::intrusive_ptr<compat::Work>()>& issue,
                 std::function<void()> finish = nullptr, bool checkable = true);
  std::shared_ptr<GroupState> state_;
};

// The state shared by every handle to one group; built by World.
struct GroupState {
  std::string name;
  std::vector<int> global_ranks;
  int rank = 0;  // this process's group rank
  int global_rank = 0;
  std::chrono::milliseconds timeout{0};
  bool check_collectives = false;  // Note [Checked collectives]
  c10::intrusive_ptr<compat::Backend> backend;
  std::unique_ptr<ArrivalBoard> board;
  std::shared_ptr<Recorder> recorder;  // shared by the world's groups; may be null
  ~GroupState();
};

}  // namespace cohort::comm
