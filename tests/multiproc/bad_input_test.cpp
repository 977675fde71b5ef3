// Bad input to the real `cohort` binary: exit code 2, the flag named, nothing started.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cohort/system/cuda.h"
#include "support/subprocess.h"

namespace {
using namespace std::chrono_literals;
const std::string kCohort = COHORT_CLI_PATH;
const std::string kWorker = COHORT_TEST_WORKER_PATH;

struct Case {
  std::vector<std::string> args;
  std::string must_mention;
};

void PrintTo(const Case& c, std::ostream* os) { *os << ::testing::PrintToString(c.args); }

class BadInput : public ::testing::TestWithParam<Case> {};

TEST_P(BadInput, ExitsTwoNamingTheProblem) {
  std::vector<std::string> argv{kCohort, "run"};
  argv.insert(argv.end(), GetParam().args.begin(), GetParam().args.end());
  auto r = cohort::testing::run_process(argv, 30s);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(GetParam().must_mention), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("[rank"), std::string::npos) << "a worker was started: " << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadInput,
    ::testing::Values(Case{{"--bogus-flag", kWorker, "env"}, "--bogus-flag"},
                      Case{{"--nproc-per-node", "0", kWorker, "env"}, "--nproc-per-node 0"},
                      Case{{"--nproc-per-node", "many", kWorker, "env"}, "--nproc-per-node many"},
                      Case{{"--nnodes", "1:2:3", kWorker, "env"}, "--nnodes 1:2:3"},
                      Case{{"--nnodes", "3:1", kWorker, "env"}, "--nnodes 3:1"},
                      Case{{"--nnodes", "1:2", kWorker, "env"}, "--nnodes 1:2"},
                      Case{{"--redirects", "7", "--log-dir", "/tmp", kWorker, "env"}, "--redirects 7"},
                      Case{{"/nonexistent/trainer"}, "/nonexistent/trainer"},
                      Case{{"no-such-program-anywhere"}, "no-such-program-anywhere"},
                      Case{{}, "no program given"}),
    [](const ::testing::TestParamInfo<Case>& info) { return "case" + std::to_string(info.index); });

TEST(BadInputPort, BusyMasterPortExitsTwo) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto port = std::to_string(ntohs(addr.sin_port));
  auto r = cohort::testing::run_process({kCohort, "run", "--master-port", port, kWorker, "env"}, 30s);
  close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--master-port " + port), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("[rank"), std::string::npos);
}

TEST(Info, ReportsVersionBackendsAndDevices) {
  auto r = cohort::testing::run_process({kCohort, "info"}, 30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("LibTorch: "), std::string::npos) << r.out;
  // A CUDA LibTorch on a machine without a GPU says so (issue 15).
  EXPECT_NE(r.out.find("(" + cohort::system::detect_cuda().describe() + ")\n"), std::string::npos) << r.out;
#ifdef COHORT_HAVE_NCCL
  EXPECT_NE(r.out.find("(CUDA LibTorch (runtime "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nccl yes"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("(CPU-only LibTorch)"), std::string::npos) << r.out;
#endif
  EXPECT_NE(r.out.find("gloo yes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("devices: cpu"), std::string::npos) << r.out;
}

TEST(Help, RunHelpDocumentsEveryFlag) {
  auto r = cohort::testing::run_process({kCohort, "run", "--help"}, 30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                           "--standalone", "--log-dir", "--redirects", "--tee", "--local-ranks-filter",
                           "--max-restarts", "--rdzv-id"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

}  // namespace
