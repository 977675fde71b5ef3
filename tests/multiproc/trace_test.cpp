// The timeline, the straggler report and the thread policy, through `cohort run`
// with real worker processes (trace/trace_worker.cpp).
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "support/subprocess.h"
#include "support/temp_dir.h"

namespace {

using cohort::testing::ProcessResult;
using cohort::testing::TempDir;
using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kCohort = COHORT_CLI_PATH;
const std::string kWorker = COHORT_TRACE_WORKER_PATH;

std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + (r.timed_out ? " TIMED OUT" : "") + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

ProcessResult cohort_run(int nproc, std::vector<std::string> flags, std::vector<std::string> worker_args,
                         const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv{kCohort, "run", "--nproc-per-node", std::to_string(nproc)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return cohort::testing::run_process(argv, 180s, env);
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

// Every thread's spans, in file order, start no earlier than the one before, and
// each either lies inside the enclosing open span or starts after it ended.
void expect_well_nested_and_monotonic(const json& events, const std::string& what) {
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> open;  // (pid, tid) -> stack of [ts, end]
  std::map<std::pair<int, int>, double> last_ts;
  int spans = 0;
  for (const auto& e : events) {
    if (e.at("ph") != "X") continue;
    ++spans;
    const std::pair<int, int> thread{e.at("pid").get<int>(), e.at("tid").get<int>()};
    const double ts = e.at("ts").get<double>(), end = ts + e.at("dur").get<double>();
    auto last = last_ts.find(thread);
    if (last != last_ts.end()) {
      ASSERT_GE(ts, last->second) << what << ": not monotonic at " << e.dump();
    }
    last_ts[thread] = ts;
    auto& stack = open[thread];
    while (!stack.empty() && ts >= stack.back().second) stack.pop_back();
    if (!stack.empty()) {
      ASSERT_LE(end, stack.back().second + 1e-3) << what << ": overlaps its parent: " << e.dump();
    }
    stack.emplace_back(ts, end);
  }
  EXPECT_GT(spans, 0) << what;
}

std::set<std::string> names(const json& events, const std::string& phase) {
  std::set<std::string> out;
  for (const auto& e : events)
    if (e.at("ph") == phase) out.insert(e.at("name").get<std::string>());
  return out;
}

TEST(Timeline, TwoRanksWriteNestedMonotonicTracesThatMerge) {
  TempDir dir;
  const auto traces = fs::path(dir.path) / "timeline";
  auto r = cohort_run(2, {"--timeline", traces.string()}, {"train", "12"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::set<int> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const auto file = traces / ("rank-" + std::to_string(rank) + ".json");
    ASSERT_TRUE(fs::exists(file)) << file << "\n" << describe(r);
    const auto doc = read_json(file);
    const auto& events = doc.at("traceEvents");
    expect_well_nested_and_monotonic(events, file.string());
    for (const auto& e : events)
      if (e.at("ph") != "M") pids.insert(e.at("pid").get<int>());
    const auto spans = names(events, "X");
    for (const char* phase : {"step", "data", "forward", "backward", "optimizer", "ddp wait and copy back"})
      EXPECT_TRUE(spans.count(phase)) << phase << " missing from " << file;
    const auto async = names(events, "b");
    EXPECT_TRUE(async.count("bucket 0")) << file;
    EXPECT_TRUE(async.count("all_reduce")) << file;
    EXPECT_EQ(names(events, "b"), names(events, "e")) << "unpaired async events in " << file;
    EXPECT_TRUE(names(events, "i").count("bucket 0 ready")) << file;
    bool sized = false;
    for (const auto& e : events)
      if (e.at("name") == "all_reduce" && e.at("ph") == "b" && e.at("args").value("bytes", 0) > 0) sized = true;
    EXPECT_TRUE(sized) << "collectives carry their sizes";
    EXPECT_EQ(doc.at("otherData").at("dropped_events"), 0);
    EXPECT_GE(doc.at("otherData").at("recording_overhead_us").get<double>(), 0);
    // One host: one clock, nothing to correct (Note [Aligned clocks]).
    EXPECT_EQ(doc.at("otherData").at("clock_offset_us").get<double>(), 0);
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));

  const auto merged_path = fs::path(dir.path) / "merged.json";
  auto m = cohort::testing::run_process({kCohort, "trace", "merge", traces.string(), merged_path.string()}, 60s);
  ASSERT_EQ(m.exit_code, 0) << describe(m);
  const auto merged = read_json(merged_path);
  std::set<int> merged_pids;
  std::set<std::string> process_names;
  for (const auto& e : merged.at("traceEvents")) {
    merged_pids.insert(e.at("pid").get<int>());
    if (e.at("ph") == "M" && e.at("name") == "process_name") process_names.insert(e.at("args").at("name"));
  }
  EXPECT_EQ(merged_pids, (std::set<int>{0, 1}));
  EXPECT_EQ(process_names, (std::set<std::string>{"rank 0", "rank 1"}));
  expect_well_nested_and_monotonic(merged.at("traceEvents"), "merged");
}

TEST(Timeline, TheStepWindowAndTheCapBoundTheFile) {
  TempDir dir;
  auto r = cohort_run(2, {"--timeline", (fs::path(dir.path) / "w").string(), "--timeline-steps", "5:7"}, {"train", "12"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::set<std::int64_t> steps;
  const auto window = read_json(fs::path(dir.path) / "w" / "rank-1.json");
  for (const auto& e : window.at("traceEvents"))
    if (e.at("ph") != "M") steps.insert(e.at("args").at("step").get<std::int64_t>());
  EXPECT_EQ(steps, (std::set<std::int64_t>{5, 6, 7}));

  r = cohort_run(2, {"--timeline", (fs::path(dir.path) / "c").string(), "--timeline-max-events", "40"}, {"train", "12"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const auto doc = read_json(fs::path(dir.path) / "c" / "rank-0.json");
  int kept = 0;
  for (const auto& e : doc.at("traceEvents")) kept += e.at("ph") != "M";
  EXPECT_EQ(kept, 40);
  EXPECT_GT(doc.at("otherData").at("dropped_events").get<int>(), 0);
}

TEST(Timeline, BadFlagsAreRefusedBeforeAnythingStarts) {
  auto r = cohort_run(2, {"--timeline-steps", "3:4"}, {"train", "2"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("add --timeline DIR"), std::string::npos) << describe(r);
  r = cohort_run(2, {"--timeline", "/tmp/x", "--timeline-steps", "9:3"}, {"train", "2"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("--timeline-steps"), std::string::npos) << describe(r);
  auto m = cohort::testing::run_process({kCohort, "trace", "merge", "/nonexistent-dir", "/tmp/out.json"}, 30s);
  EXPECT_EQ(m.exit_code, 1) << describe(m);
  EXPECT_NE(m.err.find("not a directory"), std::string::npos) << describe(m);
}

// Note [Straggler tests on a shared VM]: a step of the worker is 40-70 ms of one
// core, and its ~5 MB of gradients are reduced by Gloo's threads on the same two
// cores, so on CI's 2-core VM two balanced ranks' medians differ by up to 40% in
// one run of six, and once by 58% (rank 1 over rank 0, 2026-11-29), past the
// report's 20%. These tests prove the wiring (each rank's work times, the gather,
// the verdict, the launcher's summary) with a threshold of 100%, a rank named only
// when its median is twice the fastest's, and a slow rank that sleeps 150 ms per
// step, 3-5 times a balanced step. The 20% rule itself is tested on given numbers
// in tests/trace/straggler_test.cpp.
const std::map<std::string, std::string> kStragglerEnv{{"COHORT_TEST_STRAGGLER_THRESHOLD_PCT", "100"}};

TEST(Stragglers, ASlowRankIsNamedInTheReportAndTheLaunchersSummary) {
  auto env = kStragglerEnv;
  env.insert({{"COHORT_TEST_SLOW_RANK", "1"}, {"COHORT_TEST_SLOW_MS", "150"}});
  auto r = cohort_run(2, {}, {"train", "30"}, env);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("[rank0]: stragglers: 1\n"), std::string::npos) << describe(r);
  const auto summary = r.err.find("cohort run: summary from the workers:");
  ASSERT_NE(summary, std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("straggler: rank 1 ", summary), std::string::npos) << describe(r);
}

TEST(Stragglers, ABalancedRunNamesNoOne) {
  // 60 steps, medians. Should noise pass even 100% (a host that slows one virtual
  // CPU for the whole run), a second run decides: a report that names a balanced
  // rank by its own fault would do so every time, and the test fails when both runs
  // name someone, showing the first.
  std::string first;
  for (int run = 0; run < 2; ++run) {
    auto r = cohort_run(2, {}, {"train", "60"}, kStragglerEnv);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const bool none = r.out.find("[rank0]: stragglers:\n") != std::string::npos &&
                      r.err.find("no straggler") != std::string::npos;
    if (none) return;
    if (run == 1)
      FAIL() << "two balanced runs named a straggler\n--- first run\n" << first << "\n--- second run\n"
             << describe(r);
    first = describe(r);
  }
}

// Note [Threads per worker], observed from inside the workers.
std::map<int, std::map<std::string, std::string>> thread_lines(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> by_rank;
  std::regex line(R"(threads rank=(\d+) (.*))");
  std::regex field(R"((\w+)=(\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    const std::string rest = (*it)[2];
    auto& fields = by_rank[std::stoi((*it)[1])];
    for (std::sregex_iterator f(rest.begin(), rest.end(), field); f != end; ++f) fields[(*f)[1]] = (*f)[2];
  }
  return by_rank;
}

TEST(Threads, OneWorkerUsesEveryCoreAndSeveralGetOneThreadEach) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::map<std::string, std::string> unset{{"OMP_NUM_THREADS", ""}, {"OPENBLAS_NUM_THREADS", ""}};
  auto one = cohort_run(1, {}, {"threads"}, unset);
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  auto lines = thread_lines(one.out);
  ASSERT_EQ(lines.size(), 1u) << describe(one);
  EXPECT_EQ(lines[0]["intra_op"], std::to_string(cores)) << describe(one);
  // pip's LibTorch carries MKL, whose threads follow ATen's intra-op count (cohort
  // reports no count of its own for it); Debian's calls libblas.so.3, OpenBLAS here.
  const bool mkl = at::hasMKL();
  if (mkl) {
    EXPECT_EQ(lines[0]["blas_name"], "MKL") << describe(one);
  } else {
    EXPECT_EQ(lines[0]["blas_name"], "OpenBLAS") << "scripts/install-deps installs OpenBLAS\n" << describe(one);
    EXPECT_EQ(lines[0]["blas"], std::to_string(cores)) << describe(one);
  }

  auto two = cohort_run(2, {}, {"threads"}, unset);
  ASSERT_EQ(two.exit_code, 0) << describe(two);
  lines = thread_lines(two.out);
  ASSERT_EQ(lines.size(), 2u) << describe(two);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(lines[rank]["intra_op"], "1") << describe(two);
    if (!mkl) {
      EXPECT_EQ(lines[rank]["blas"], "1") << describe(two);
    }
  }
  // Compute threads aside, a worker runs Gloo's and the store's: the total stays
  // small and does not grow with the core count.
  EXPECT_LT(std::stoi(lines[1]["os_threads"]), 16) << describe(two);

  // The user's choice is kept, and OpenBLAS follows OMP_NUM_THREADS.
  auto chosen = cohort_run(2, {}, {"threads"}, {{"OMP_NUM_THREADS", "2"}, {"OPENBLAS_NUM_THREADS", ""}});
  ASSERT_EQ(chosen.exit_code, 0) << describe(chosen);
  lines = thread_lines(chosen.out);
  EXPECT_EQ(lines[0]["intra_op"], "2") << describe(chosen);
  if (!mkl) {
    EXPECT_EQ(lines[0]["blas"], "2") << describe(chosen);
  }
}

// `cohort info` names the BLAS that libblas.so.3 resolves to: point the library
// path at each of Debian's two.
TEST(Info, NamesTheBlasAndWarnsOnTheReferenceOne) {
  const std::string multiarch = "/usr/lib/x86_64-linux-gnu";
  if (at::hasMKL()) {
    // pip's LibTorch carries MKL: its products never call libblas.so.3, whichever
    // of Debian's two the path selects, and `cohort info` says so.
    for (const char* dir : {"/blas", "/openblas-pthread"}) {
      auto r = cohort::testing::run_process({kCohort, "info", "--json"}, 60s, {{"LD_LIBRARY_PATH", multiarch + dir}});
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      auto j = json::parse(r.out);
      EXPECT_EQ(j.at("blas").at("name"), "MKL") << r.out;
      EXPECT_FALSE(j.at("blas").at("reference").get<bool>()) << r.out;
      EXPECT_EQ(r.err.find("warning"), std::string::npos) << describe(r);
      EXPECT_GT(j.at("gemm_gflops_per_core").get<double>(), 0);
    }
    auto text = cohort::testing::run_process({kCohort, "info", "--no-gemm"}, 60s);
    ASSERT_EQ(text.exit_code, 0) << describe(text);
    EXPECT_NE(text.out.find("BLAS: MKL"), std::string::npos) << describe(text);
    EXPECT_NE(text.out.find("threads: intra-op"), std::string::npos) << describe(text);
    return;
  }
  auto reference = cohort::testing::run_process({kCohort, "info", "--json"}, 60s,
                                                {{"LD_LIBRARY_PATH", multiarch + "/blas"}});
  ASSERT_EQ(reference.exit_code, 0) << describe(reference);
  auto j = json::parse(reference.out);
  EXPECT_EQ(j.at("blas").at("name"), "reference BLAS") << reference.out;
  EXPECT_TRUE(j.at("blas").at("reference").get<bool>());
  EXPECT_NE(reference.err.find("apt-get install libopenblas0-pthread"), std::string::npos) << describe(reference);
  const double slow = j.at("gemm_gflops_per_core").get<double>();

  auto fast = cohort::testing::run_process({kCohort, "info", "--json"}, 60s,
                                           {{"LD_LIBRARY_PATH", multiarch + "/openblas-pthread"}});
  ASSERT_EQ(fast.exit_code, 0) << describe(fast);
  j = json::parse(fast.out);
  EXPECT_EQ(j.at("blas").at("name"), "OpenBLAS") << fast.out;
  EXPECT_NE(j.at("blas").at("library").get<std::string>().find("openblas"), std::string::npos) << fast.out;
  EXPECT_EQ(fast.err.find("warning"), std::string::npos) << describe(fast);
  EXPECT_GT(j.at("gemm_gflops_per_core").get<double>(), 0);
  EXPECT_GT(slow, 0);

  auto text = cohort::testing::run_process({kCohort, "info", "--no-gemm"}, 60s);
  ASSERT_EQ(text.exit_code, 0) << describe(text);
  EXPECT_NE(text.out.find("BLAS: OpenBLAS"), std::string::npos) << describe(text);
  EXPECT_NE(text.out.find("threads: intra-op"), std::string::npos) << describe(text);
}

}  // namespace
