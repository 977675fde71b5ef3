#include <gtest/gtest.h>

#include <sstream>

#include "cohort/launcher/cli.h"

namespace {
using cohort::launcher::parse_run_command;
using cohort::launcher::RunOptions;
using cohort::launcher::UsageError;

RunOptions parse(std::vector<std::string> args) {
  std::ostringstream help;
  auto o = parse_run_command(args, help);
  EXPECT_TRUE(o.has_value());
  return o.value_or(RunOptions{});
}

TEST(Cli, DefaultsAndProgramArguments) {
  auto o = parse({"./train", "--epochs", "3"});
  EXPECT_EQ(o.nproc_per_node, "1");
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.master_port, 0);
  EXPECT_EQ(o.program, "./train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--epochs", "3"}));
}

TEST(Cli, TorchrunSpellingsAndDoubleDash) {
  auto o = parse({"--nproc_per_node", "4", "--master-port=29511", "--rdzv_id", "abc", "--", "prog", "--nnodes", "9"});
  EXPECT_EQ(o.nproc_per_node, "4");
  EXPECT_EQ(o.master_port, 29511);
  EXPECT_EQ(o.run_id, "abc");
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--nnodes", "9"}));
}

TEST(Cli, DoubleDashAllowsAProgramNamedLikeAFlag) {
  auto o = parse({"--", "-odd-name", "x"});
  EXPECT_EQ(o.program, "-odd-name");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"x"}));
}

TEST(Cli, StreamsAndFilter) {
  auto o = parse({"--redirects", "0:1,1:3", "--tee", "2", "--local-ranks-filter", "0,2", "prog"});
  EXPECT_TRUE(o.redirects.stdout_for(0));
  EXPECT_FALSE(o.redirects.stderr_for(0));
  EXPECT_TRUE(o.redirects.stderr_for(1));
  EXPECT_FALSE(o.redirects.stdout_for(2));
  EXPECT_TRUE(o.tee.stderr_for(5));
  EXPECT_EQ(*o.local_ranks_filter, (std::set<int>{0, 2}));
}

TEST(Cli, StandaloneForcesLoopbackAndFreePort) {
  auto o = parse({"--standalone", "--master-addr", "10.0.0.1", "--master-port", "1234", "prog"});
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);
}

TEST(Cli, HelpReturnsNothing) {
  std::ostringstream help;
  EXPECT_FALSE(parse_run_command({"--help"}, help).has_value());
  EXPECT_NE(help.str().find("--nproc-per-node"), std::string::npos);
}

void expect_usage_error(std::vector<std::string> args, const std::string& mention) {
  std::ostringstream help;
  try {
    parse_run_command(args, help);
    ADD_FAILURE() << "accepted: " << ::testing::PrintToString(args);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

TEST(Cli, BadInputNamesTheFlag) {
  expect_usage_error({"--nope", "prog"}, "--nope");
  expect_usage_error({"--nproc-per-node", "0", "prog"}, "--nproc-per-node 0");
  expect_usage_error({"--nproc-per-node", "-2", "prog"}, "--nproc-per-node -2");
  expect_usage_error({"--nnodes", "1:2:3", "prog"}, "--nnodes 1:2:3");
  expect_usage_error({"--nnodes", "3:1", "prog"}, "MIN 3 is greater than MAX 1");
  expect_usage_error({"--nnodes", "0", "prog"}, "at least 1");
  expect_usage_error({"--nnodes", "2", "--node-rank", "2", "--master-port", "5", "prog"}, "--node-rank 2");
  expect_usage_error({"--nnodes", "2", "prog"}, "--master-port");
  expect_usage_error({"--master-port", "70000", "prog"}, "--master-port 70000");
  expect_usage_error({"--max-restarts", "-1", "prog"}, "--max-restarts -1");
  expect_usage_error({"--stop-timeout", "-1", "prog"}, "--stop-timeout");
  expect_usage_error({"--join-timeout", "0", "prog"}, "--join-timeout");
  expect_usage_error({"--stop-timeout", "inf", "prog"}, "--stop-timeout");
  expect_usage_error({"--tee", "1:9", "prog"}, "--tee 1:9");
  expect_usage_error({"--local-ranks-filter", "a", "prog"}, "--local-ranks-filter a");
  expect_usage_error({"--master-port", "x", "prog"}, "--master-port");
  expect_usage_error({}, "no program given");
}

TEST(Cli, ResolveNproc) {
  using cohort::launcher::resolve_nproc;
  EXPECT_EQ(resolve_nproc("3", 8, 0), 3);
  EXPECT_EQ(resolve_nproc("auto", 8, 0), 8);
  EXPECT_EQ(resolve_nproc("auto", 8, 2), 2);
  EXPECT_EQ(resolve_nproc("cpu", 8, 2), 8);
  EXPECT_EQ(resolve_nproc("gpu", 8, 2), 2);
  EXPECT_THROW(resolve_nproc("gpu", 8, 0), UsageError);
}

}  // namespace
