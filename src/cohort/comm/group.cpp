#include "cohort/system/stream_capture.h"
#include "cohort/comm/group.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <ATen/core/ivalue.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <mutex>

#include "cohort/comm/arrival_board.h"
#include "cohort/errors.h"

namespace cohort::comm {
namespace {

// Note [One Gloo launch at a time]
// PyTorch's flight recorder (c10d::FlightRecorder, in LibTorch 2.x; 1.13 has none)
// is one object per process, shared by every process group, and each collective's
// launch records into it. Its record() looks up and inserts the group in a std::map
// *before* taking its own mutex, so two groups of one process launching at the same
// moment from two threads corrupt that map. Ranks as threads (tests' thread worlds)
// died of it under PyTorch 2.11: SIGSEGV in std::_Rb_tree_insert_and_rebalance under
// FlightRecorder::recordWithResetEnabled: 3 of 25 runs of the whole zero_tests
// binary, and one test in CI (stop 39); with this lock, none of 40 runs. A program
// with one rank per process can meet it too, when two of its groups launch from two
// threads (DDP's buckets from autograd's thread while the main thread uses another
// group, a fault-tolerant regroup).
// So every Gloo launch in this process takes one mutex, held only for the call that
// enqueues the work (microseconds: Gloo's collectives run on its worker threads, and
// its send and recv post a buffer and return), never for the wait. NCCL's launches
// are left alone: the first one on a communicator can block in its lazy set-up
// until the peers arrive, and a process-wide lock held across that could deadlock
// two groups whose ranks launch in different orders. NCCL groups launched from
// several threads of one process therefore remain exposed to PyTorch's race.
std::mutex& gloo_launch_mutex() {
  static std::mutex m;
  return m;
}

bool looks_like_timeout(const std::string& what) {
  for (const char* needle : {"imed out", "imeout", "TIMEOUT"})
    if (what.find(needle) != std::string::npos) return true;
  return false;
}

// Note [A peer that gave up first]
// Two ranks that called different collectives both wait out the timeout, but not to
// the same millisecond: the one that entered first gives up first, and Gloo (LibTorch
// 1.13 and 2.x) closes that rank's connections as it does. The other rank then fails on a
// closed connection just before its own timeout, which alone reads like a crash (stop
// 52's red CI: 2 of 10 runs under load). A wait that has lasted kPositionsPublished
// has given every peer time to publish what it called (Note [Arrival board]), so a
// closed connection after such a wait reads the board: a peer that called another
// collective as this one is the cause, and the error says so. A fast failure (a
// crash) costs no store reads, and the board's verdict of "elsewhere" is never a
// guess: a peer publishes only what it called.
constexpr auto kPositionsPublished = std::chrono::milliseconds(250);

[[noreturn]] void throw_diagnosed(const GroupState& g, const char* op, std::int64_t seq,
                                  const std::string& backend_message,
                                  std::chrono::steady_clock::duration waited = {}) {
  auto where = fmt::format("{} #{} of group '{}' ({} ranks, backend {})", op, seq, g.name,
                           g.global_ranks.size(), g.backend->getBackendName());
  if (looks_like_timeout(backend_message)) {
    auto peers = g.board->diagnose(seq, op);
    auto missing = ArrivalBoard::missing(peers);
    auto seconds = std::chrono::duration<double>(g.timeout).count();
    auto not_arrived = ArrivalBoard::explain(g.global_rank, op, seq, peers);
    throw TimeoutError(
        fmt::format("cohort: rank {} timed out after {:.1f} s in {}.\n  {}.\n  fix: every rank must call the "
                    "same collectives in the same order; read the output of the ranks named above; if a step is "
                    "legitimately this slow, raise InitOptions::timeout (or COHORT_TIMEOUT).\n  backend: {}",
                    g.global_rank, seconds, where, not_arrived, backend_message),
        op, missing);
  }
  if (waited >= kPositionsPublished) {  // Note [A peer that gave up first]
    auto peers = g.board->diagnose(seq, op);
    const bool elsewhere = std::any_of(peers.begin(), peers.end(), [](const PeerStatus& p) {
      return p.state == PeerStatus::State::kElsewhere;
    });
    if (elsewhere) {
      auto why = ArrivalBoard::explain(g.global_rank, op, seq, peers);
      g.board->mark_broken(fmt::format("rank {} in {} #{}: {}", g.global_rank, op, seq, why));
      throw CommError(fmt::format(
          "cohort: rank {}: {} failed: {}; a peer gave up waiting and closed its connection.\n  fix: every rank must "
          "call the same collectives in the same order; read the output of the ranks named above.\n  backend: {}",
          g.global_rank, where, why, backend_message));
    }
  }
  // Note [A broken group]: the members still waiting, some of them on live peers
  // that have left, leave now. (A timeout is not marked: every member waits out the
  // same timeout, and each names the missing ranks itself.)
  g.board->mark_broken(fmt::format("rank {} lost a peer in {} #{}: {}", g.global_rank, op, seq, backend_message));
  // A fast failure (a closed connection) comes before the peers' positions are
  // published (Note [Arrival board]), so the board is not quoted here.
  throw CommError(fmt::format(
      "cohort: rank {}: {} failed: a peer closed its connection or the transport broke.\n  fix: a peer most likely "
      "exited or crashed; its own output (or the `cohort run` summary) names the first failure.\n  backend: {}",
      g.global_rank, where, backend_message));
}

[[noreturn]] void throw_broken(const GroupState& g, const char* op, std::int64_t seq, const std::string& why) {
  throw CommError(fmt::format(
      "cohort: rank {}: {} #{} of group '{}' ({} ranks, backend {}) was abandoned: another member's collective on "
      "this group failed ({}), so this one cannot complete.\n  fix: a peer most likely exited or crashed; its own "
      "output (or the `cohort run` summary) names the first failure",
      g.global_rank, op, seq, g.name, g.global_ranks.size(), g.backend->getBackendName(), why));
}

// Note [A broken group] (arrival_board.h): a Gloo wait sleeps on the work's future,
// waking every kBrokenPoll to ask whether another member marked the group broken.
// Returns when the work completed (its result is then read by work.wait(), at
// once); throws "wait timed out" at the group's timeout. A work without a future
// (Gloo's send and recv in some versions) is waited for as before.
void wait_watching(const GroupState& g, compat::Work& work, const char* op, std::int64_t seq) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work.getFuture();
  } catch (const std::exception&) {
    future.reset();
  }
  if (!future) {
    if (!work.wait(g.timeout)) throw std::runtime_error("wait timed out");
    return;
  }
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();  // outlives an abandoned wait: the callback holds it
  future->addCallback([done](c10::ivalue::Future&) {
    {
      std::lock_guard<std::mutex> lock(done->mu);
      done->done = true;
    }
    done->cv.notify_all();
  });
  auto& board = *g.board;
  board.begin_wait();
  struct EndWait {
    ArrivalBoard& b;
    ~EndWait() { b.end_wait(); }
  } end_wait{board};
  const auto deadline = std::chrono::steady_clock::now() + g.timeout;
  {
    std::unique_lock<std::mutex> lock(done->mu);
    while (!done->done) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) throw std::runtime_error("wait timed out");
      done->cv.wait_for(lock, std::min<std::chrono::steady_clock::duration>(ArrivalBoard::kBrokenPoll, deadline - now));
      if (done->done) break;
      auto why = board.broken();
      if (!why.empty()) {
        lock.unlock();
        throw_broken(g, op, seq, why);
      }
    }
  }
  if (!work.wait(g.timeout)) throw std::runtime_error("wait timed out");
}

void check_tensor(const GroupState& g, const char* op, const at::Tensor& t) {
  if (!t.defined()) throw ConfigError(fmt::format("cohort: {}: the tensor is undefined", op));
  if (!t.is_contiguous())
    throw ConfigError(fmt::format("cohort: {}: the tensor must be contiguous (call .contiguous() first)", op));
  auto backend = g.backend->getBackendName();
  if (backend == "nccl" && !t.is_cuda())
    throw ConfigError(fmt::format("cohort: {} on rank {}: the NCCL backend needs CUDA tensors but the tensor is on "
                                  "{}; move it with .to(world.device())",
                                  op, g.global_rank, t.device().str()));
}

// Note [Checked collectives]
// Gloo pairs collectives by order. Two ranks that call collectives of different
// sizes at the same point are paired anyway, and the one that receives more than
// it posted aborts the whole process from Gloo's transport thread
// (EnforceNotMet: op.preamble.length <= op.nbytes), where no caller can catch it.
// With InitOptions::check_collectives, every group-wide collective is preceded by
// an all-gather of a fixed-size fingerprint (operation, bytes): those always pair
// with each other, and a difference is a ConfigError on every rank, naming each
// rank's call, before anything of the mis-paired collective is sent. Point-to-
// point operations, work issued outside the group (track()) and NCCL groups are
// not checked.
const char* const kCheckedOps[] = {"all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};

std::int64_t op_code(const char* op) {
  for (std::size_t i = 0; i < std::size(kCheckedOps); ++i)
    if (std::strcmp(op, kCheckedOps[i]) == 0) return static_cast<std::int64_t>(i);
  return -1;
}

void check_same_call(GroupState& g, const char* op, std::int64_t seq, std::int64_t bytes) {
  const int n = static_cast<int>(g.global_ranks.size());
  auto mine = at::tensor({op_code(op), bytes}, at::TensorOptions().dtype(at::kLong));
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < n; ++r) all[0].push_back(at::empty_like(mine));
  std::vector<at::Tensor> in{mine};
  c10d::AllgatherOptions opts;
  opts.timeout = g.timeout;
  try {
    auto work = g.backend->allgather(all, in, opts);
    if (!work->wait(g.timeout)) throw std::runtime_error("wait timed out");
  } catch (const std::exception& e) {
    throw_diagnosed(g, op, seq, e.what());
  }
  bool same = true;
  for (const auto& t : all[0]) same = same && at::equal(t, mine);
  if (same) return;
  std::string calls;
  for (int r = 0; r < n; ++r) {
    const auto code = all[0][r][0].item<std::int64_t>();
    calls += fmt::format("{}rank {}: {} of {} bytes", r ? ", " : "", g.global_ranks[r],
                         code >= 0 && code < static_cast<std::int64_t>(std::size(kCheckedOps)) ? kCheckedOps[code] : "?",
                         all[0][r][1].item<std::int64_t>());
  }
  throw ConfigError(fmt::format(
      "cohort: rank {}: {} #{} of group '{}' differs between the ranks ({}). Issued, Gloo would pair these calls "
      "and abort the process, or mix the data. Fix: every rank must call the same collectives in the same order, "
      "with tensors of the same size (checked because check_collectives / COHORT_CHECK_COLLECTIVES is on)",
      g.global_rank, op, seq, g.name, calls));
}

void check_root(const GroupState& g, const char* op, int root) {
  const int n = static_cast<int>(g.global_ranks.size());
  if (root < 0 || root >= n)
    throw ConfigError(fmt::format("cohort: {} root {} is not a rank of group '{}' (0..{})", op, root, g.name, n - 1));
}

}  // namespace

GroupState::~GroupState() = default;

// ---- Pending ---------------------------------------------------------------

Pending::Pending(std::shared_ptr<GroupState> group, c10::intrusive_ptr<compat::Work> work, const char* op,
                 std::int64_t seq, std::function<void()> finish, double started_us, std::int64_t bytes,
                 std::optional<c10::Device> device, std::shared_ptr<DeviceMark> device_start)
    : group_(std::move(group)),
      work_(std::move(work)),
      op_(op),
      seq_(seq),
      finish_(std::move(finish)),
      started_us_(started_us),
      bytes_(bytes),
      device_(device),
      device_start_(std::move(device_start)) {}

void Pending::wait() {
  if (!work_) return;
  auto work = std::move(work_);
  // Note [DDP inside a CUDA graph] (ddp/step_end.cpp): while the stream is captured,
  // the stream waits and the host goes on; c10d's wait() without a timeout does
  // that for NCCL. No timeout can bound it here (nothing runs before a replay); the
  // backend's watchdog, which has the group's timeout, bounds each replay's.
  if (device_ && system::stream_capturing(*device_)) {
    work->wait();
    if (finish_) finish_();
    return;
  }
  // Note [Device time on the host's clock]: the device's end of the operation is
  // marked on a side stream made to wait for the backend by Work::synchronize().
  // NCCL's completion event exists from the launch, so the side stream waits for it
  // before the host's wait (which polls it every millisecond), though after the
  // caller's stream does: that synchronize() lets NCCL release what it stashed for the
  // allocator, safe only once the caller's stream waits. Gloo's events exist only once
  // its host thread is done, so there the side stream waits after the host's wait.
  std::shared_ptr<DeviceMark> device_end;
  const bool recording_device = device_start_ && group_->recorder;
  const bool before = recording_device && group_->backend->getBackendName() == "nccl";
  const auto wait_began = std::chrono::steady_clock::now();
  auto mark_end = [&] { device_end = group_->recorder->device_mark_after(*device_, [&] { work->synchronize(); }); };
  try {
    if (before) {
      work->synchronize();
      mark_end();
    }
    if (group_->backend->getBackendName() == "gloo")
      wait_watching(*group_, *work, op_, seq_);
    else if (!work->wait(group_->timeout))
      throw std::runtime_error("wait timed out");
  } catch (const cohort::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw_diagnosed(*group_, op_, seq_, e.what(), std::chrono::steady_clock::now() - wait_began);
  }
  if (recording_device && !before) mark_end();
  if (device_end)
    group_->recorder->device_async(op_, "collective", std::move(device_start_), std::move(device_end), bytes_);
  if (finish_) finish_();
  // In flight from launch to this wait: drawn as an async event, since an operation
  // launched inside one phase may be waited for in another (Note [Well-nested spans]).
  if (started_us_ >= 0 && group_->recorder)
    group_->recorder->async(op_, "collective", started_us_, steady_now_us(), bytes_);
}

bool Pending::is_completed() const { return !work_ || work_->isCompleted(); }

// ---- Group -----------------------------------------------------------------

GroupState& Group::checked(const char* op) const {
  if (!state_)
    throw ConfigError(fmt::format("cohort: {} on a group this rank is not a member of; only ranks listed in "
                                  "World::new_group(ranks) may use that group",
                                  op));
  return *state_;
}


int Group::rank() const { return checked("rank").rank; }
int Group::size() const { return static_cast<int>(checked("size").global_ranks.size()); }
const std::vector<int>& Group::global_ranks() const { return checked("global_ranks").global_ranks; }
const std::string& Group::name() const { return checked("name").name; }
std::string Group::backend_name() const { return checked("backend_name").backend->getBackendName(); }
std::chrono::milliseconds Group::timeout() const { return checked("timeout").timeout; }
compat::Backend& Group::backend() const { return *checked("backend").backend; }
Recorder* Group::recorder() const { return state_ ? state_->recorder.get() : nullptr; }

Pending Group::launch(const char* op, std::optional<c10::Device> device, std::int64_t bytes,
                      const std::function<c10::intrusive_ptr<compat::Work>()>& issue, std::function<void()> finish,
                      bool checkable) {
  auto& g = *state_;
  const bool recording = g.recorder && g.recorder->recording();
  const double started = recording ? steady_now_us() : -1;
  auto seq = g.board->enter(op);
  // CPU fingerprints: Gloo only (NCCL pairs by size on the device, and fails there).
  if (g.check_collectives && checkable && op_code(op) >= 0 && g.global_ranks.size() > 1 &&
      g.backend->getBackendName() != "nccl")
    check_same_call(g, op, seq, bytes);
  // Marked before the issue: the backend's stream starts from this point of ours.
  // Outside the try below, whose catch blames the backend.
  auto device_start = recording && device ? g.recorder->device_mark(*device) : nullptr;
  c10::intrusive_ptr<compat::Work> work;
  try {
    std::unique_lock<std::mutex> lock(gloo_launch_mutex(), std::defer_lock);  // Note [One Gloo launch at a time]
    if (g.backend->getBackendName() == "gloo") lock.lock();
    work = issue();
  } catch (const std::exception& e) {
    // The backend refused the call itself (dtype, shape, device): this rank's input,
    // not a peer, is at fault.
    throw ConfigError(fmt::format("cohort: rank {}: {} #{} of group '{}' was refused by the {} backend: {}",
                                  g.global_rank, op, seq, g.name, g.backend->getBackendName(), e.what()));
  }
  return Pending(state_, std::move(work), op, seq, std::move(finish), started, bytes, device, std::move(device_start));
}

Pending Group::track(c10::intrusive_ptr<compat::Work> work, const char* op, std::int64_t bytes) {
  checked(op);
  return launch(op, std::nullopt, bytes, [&] { return work; }, nullptr, /*checkable=*/false);
}

Pending Group::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
  auto& g = checked("all_reduce");
  check_tensor(g, "all_reduce", tensor);
  if (op == ReduceOp::kAvg && !tensor.is_floating_point())
    throw ConfigError("cohort: all_reduce with kAvg needs a floating-point tensor, got " +
                      std::string(tensor.dtype().name()) + "; use kSum and divide yourself");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = g.timeout;
  std::function<void()> finish;
  if (op == ReduceOp::kAvg) finish = [tensor, n = size()]() mutable { tensor.div_(n); };
  return launch("all_reduce", tensor.device(), tensor.nbytes(), [&] { return g.backend->allreduce(tensors, opts); },
                std::move(finish));
}

void Group::all_reduce(at::Tensor& tensor, ReduceOp op) { all_reduce_async(tensor, op).wait(); }

Pending Group::reduce_async(at::Tensor& tensor, int root, ReduceOp op) {
  auto& g = checked("reduce");
  check_tensor(g, "reduce", tensor);
  check_root(g, "reduce", root);
  if (op == ReduceOp::kAvg)
    throw ConfigError("cohort: reduce with kAvg is not offered (Gloo has no average); use kSum and divide");
  std::vector<at::Tensor> tensors{tensor};
  c10d::ReduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.rootRank = root;
  opts.timeout = g.timeout;
  return launch("reduce", tensor.device(), tensor.nbytes(), [&] { return g.backend->reduce(tensors, opts); });
}

Pending Group::broadcast_async(at::Tensor& tensor, int root) {
  auto& g = checked("broadcast");
  check_tensor(g, "broadcast", tensor);
  check_root(g, "broadcast", root);
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = g.timeout;
  return launch("broadcast", tensor.device(), tensor.nbytes(), [&] { return g.backend->broadcast(tensors, opts); });
}

void Group::broadcast(at::Tensor& tensor, int root) { broadcast_async(tensor, root).wait(); }

std::vector<at::Tensor> Group::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> parts;
  all_gather_async(tensor, parts).wait();
  return parts;
}

Pending Group::all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& parts) {
  auto& g = checked("all_gather");
  check_tensor(g, "all_gather", tensor);
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < size(); ++i) outputs[0].push_back(at::empty_like(tensor));
  parts = outputs[0];  // handles: the backend fills the same tensors
  std::vector<at::Tensor> inputs{tensor};
  c10d::AllgatherOptions opts;
  opts.timeout = g.timeout;
  return launch("all_gather", tensor.device(), tensor.nbytes() * size(),
                [&] { return g.backend->allgather(outputs, inputs, opts); });
}

Pending Group::all_gather_into_async(const at::Tensor& tensor, std::vector<at::Tensor> parts) {
  auto& g = checked("all_gather");
  check_tensor(g, "all_gather", tensor);
  TORCH_INTERNAL_ASSERT(static_cast<int>(parts.size()) == size(), "one part per rank");
  std::vector<std::vector<at::Tensor>> outputs{std::move(parts)};
  std::vector<at::Tensor> inputs{tensor};
  c10d::AllgatherOptions opts;
  opts.timeout = g.timeout;
  return launch("all_gather", tensor.device(), tensor.nbytes() * size(),
                [&] { return g.backend->allgather(outputs, inputs, opts); });
}

Pending Group::reduce_scatter_async(at::Tensor& input, at::Tensor& output) {
  auto& g = checked("reduce_scatter");
  check_tensor(g, "reduce_scatter", input);
  const int n = size();
  TORCH_INTERNAL_ASSERT(input.dim() == 1 && input.numel() == output.numel() * n && output.is_contiguous(),
                        "reduce_scatter_async: a flat input of size() chunks, one chunk's output");
  if (g.backend->getBackendName() == "nccl") {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(ReduceOp::kSum);
    opts.timeout = g.timeout;
    return launch("reduce_scatter", input.device(), input.nbytes(),
                  [&] { return g.backend->_reduce_scatter_base(output, input, opts); });
  }
  std::vector<at::Tensor> tensors{input};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(ReduceOp::kSum);
  opts.timeout = g.timeout;
  auto finish = [input, output, chunk = output.numel(), r = rank()]() mutable {
    output.copy_(input.narrow(0, chunk * r, chunk));
  };
  return launch("reduce_scatter", input.device(), input.nbytes(), [&] { return g.backend->allreduce(tensors, opts); },
                std::move(finish));
}

at::Tensor Group::reduce_scatter(const at::Tensor& input, ReduceOp op) {
  auto& g = checked("reduce_scatter");
  check_tensor(g, "reduce_scatter", input);
  const int n = size();
  if (input.dim() == 0 || input.size(0) % n != 0)
    throw ConfigError(fmt::format("cohort: reduce_scatter needs an input whose first dimension divides into {} "
                                  "equal chunks; got shape {}",
                                  n, c10::str(input.sizes())));
  const int64_t chunk = input.size(0) / n;
  if (g.backend->getBackendName() == "nccl") {
    auto output = at::empty_like(input.narrow(0, 0, chunk));
    auto in = input;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = g.timeout;
    launch("reduce_scatter", input.device(), input.nbytes(),
           [&] { return g.backend->_reduce_scatter_base(output, in, opts); })
        .wait();
    if (op == ReduceOp::kAvg) output.div_(n);
    return output;
  }
  // Gloo has no reduce-scatter in every LibTorch we support: reduce the whole input
  // and keep this rank's chunk. Same result, n times the traffic.
  auto full = input.clone();
  all_reduce(full, op);
  return full.narrow(0, chunk * rank(), chunk).clone();
}

void Group::barrier() {
  auto& g = checked("barrier");
  c10d::BarrierOptions opts;
  opts.timeout = g.timeout;
  launch("barrier", std::nullopt, 0, [&] { return g.backend->barrier(opts); }).wait();
}

namespace {
void check_peer(const GroupState& g, const char* op, int peer, const char* role) {
  const int n = static_cast<int>(g.global_ranks.size());
  if (peer < 0 || peer >= n || peer == g.rank)
    throw ConfigError(fmt::format("cohort: {} on rank {}: the {} {} must be another rank of group '{}' (0..{})", op,
                                  g.rank, role, peer, g.name, n - 1));
}
}  // namespace

void Group::send(const at::Tensor& tensor, int dst, int tag) { send_async(tensor, dst, tag).wait(); }

void Group::recv(at::Tensor& tensor, int src, int tag) { recv_async(tensor, src, tag).wait(); }

Pending Group::send_async(const at::Tensor& tensor, int dst, int tag) {
  auto& g = checked("send");
  check_tensor(g, "send", tensor);
  check_peer(g, "send", dst, "destination");
  std::vector<at::Tensor> tensors{tensor};
  return launch("send", tensor.device(), tensor.nbytes(), [&] { return g.backend->send(tensors, dst, tag); });
}

Pending Group::recv_async(at::Tensor& tensor, int src, int tag) {
  auto& g = checked("recv");
  check_tensor(g, "recv", tensor);
  check_peer(g, "recv", src, "source");
  std::vector<at::Tensor> tensors{tensor};
  return launch("recv", tensor.device(), tensor.nbytes(), [&] { return g.backend->recv(tensors, src, tag); });
}

}  // namespace cohort::comm
