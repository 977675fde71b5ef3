// --fault-tolerance in-process, the launcher's pure pieces: flags, the workers'
// variables, the keys on the store and the lines on stderr (launcher/in_process.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <sstream>

#include "cohort/launcher/cli.h"
#include "cohort/launcher/in_process.h"
#include "cohort/launcher/run_options.h"
#include "cohort/launcher/worker_env.h"
#include "cohort/util/bytes.h"

namespace {
using namespace cohort::launcher;

RunOptions parse(std::vector<std::string> args, const cohort::comm::EnvMap& env = {}) {
  std::ostringstream help;
  auto o = parse_run_command(args, help, env);
  EXPECT_TRUE(o.has_value());
  return o.value_or(RunOptions{});
}

void expect_usage_error(std::vector<std::string> args, const std::string& needle) {
  std::ostringstream help;
  try {
    parse_run_command(args, help, {});
    ADD_FAILURE() << "no error for: " << ::testing::PrintToString(args);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(InProcessFlags, DefaultsAndValues) {
  auto o = parse({"prog"});
  EXPECT_EQ(o.fault_tolerance, "none");
  EXPECT_FALSE(o.min_replicas.has_value());
  EXPECT_FALSE(in_process_fault_tolerance(o));
  o = parse({"--fault-tolerance", "in-process", "--min-replicas", "2", "--nproc-per-node", "3", "prog"});
  EXPECT_TRUE(in_process_fault_tolerance(o));
  EXPECT_EQ(o.min_replicas.value_or(-1), 2);
  o = parse({"prog"}, {{"PET_FAULT_TOLERANCE", "in-process"}, {"PET_MIN_REPLICAS", "1"}});
  EXPECT_TRUE(in_process_fault_tolerance(o));
  EXPECT_EQ(o.min_replicas.value_or(-1), 1);
  // auto and cpu are checked once the worker count is known (run_agent).
  EXPECT_EQ(parse({"--fault-tolerance", "in-process", "--min-replicas", "9", "--nproc-per-node", "auto", "prog"})
                .min_replicas.value_or(-1),
            9);
}

TEST(InProcessFlags, RefusalsNameTheFlagAndTheFix) {
  expect_usage_error({"--fault-tolerance", "sometimes", "prog"}, "--fault-tolerance sometimes: use none");
  expect_usage_error({"--min-replicas", "2", "prog"}, "--min-replicas only applies to --fault-tolerance in-process");
  expect_usage_error({"--fault-tolerance", "in-process", "--min-replicas", "0", "prog"}, "--min-replicas 0: must be");
  expect_usage_error({"--fault-tolerance", "in-process", "--min-replicas", "4", "--nproc-per-node", "3", "prog"},
                     "--min-replicas 4: the job has only 3");
  expect_usage_error({"--fault-tolerance", "in-process", "--standalone", "prog"}, "--standalone yet");
  expect_usage_error({"--fault-tolerance", "in-process", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5",
                      "--rdzv-conf", "worker_store=tcpstore", "prog"},
                     "not supported with --rdzv-conf worker_store=tcpstore yet");
  // The elastic rendezvous is taken (Note [Held rounds]), and a bad --rdzv-conf is
  // still named by the elastic checks.
  EXPECT_TRUE(in_process_fault_tolerance(
      parse({"--fault-tolerance", "in-process", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5",
             "prog"})));
  expect_usage_error({"--fault-tolerance", "in-process", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5",
                      "--rdzv-conf", "join_timeout=x", "prog"},
                     "--rdzv-conf join_timeout=x: not a number");
  // Static nodes are taken (Note [In-process fault tolerance needs a world that
  // keeps its shape]); --min-replicas counts the workers of every node.
  EXPECT_TRUE(in_process_fault_tolerance(
      parse({"--fault-tolerance", "in-process", "--nnodes", "2", "--master-port", "5", "--min-replicas", "4",
             "--nproc-per-node", "2", "prog"})));
  expect_usage_error({"--fault-tolerance", "in-process", "--nnodes", "2", "--master-port", "5", "--min-replicas", "5",
                      "--nproc-per-node", "2", "prog"},
                     "--min-replicas 5: the job has only 4");
  // What run_agent checks once --nproc-per-node auto or cpu is resolved.
  RunOptions o;
  o.fault_tolerance = "in-process";
  o.min_replicas = 3;
  EXPECT_THROW(check_min_replicas(o, 2), UsageError);
  o.min_replicas = 2;
  EXPECT_NO_THROW(check_min_replicas(o, 2));
}

TEST(InProcessEnv, EveryIncarnationGetsTheSameEnvironmentButItsNumber) {
  auto o = parse({"--fault-tolerance", "in-process", "--min-replicas", "2", "--nproc-per-node", "3", "prog"});
  WorkerSlot slot{1, 1, 3, 3, 0, 1};
  AttemptContext ctx{"127.0.0.1", 4242, 0, "job"};
  auto first = worker_environment({{"COHORT_STORE_PREFIX", "/p"}}, o, slot, ctx, "/e0.json", 0);
  auto second = worker_environment({{"COHORT_STORE_PREFIX", "/p"}}, o, slot, ctx, "/e0.json", 1);
  EXPECT_EQ(first["COHORT_FAULT_TOLERANCE"], "in-process");
  EXPECT_EQ(first["COHORT_FT_MIN_REPLICAS"], "2");
  EXPECT_EQ(first["COHORT_FT_INCARNATION"], "0");
  EXPECT_EQ(second["COHORT_FT_INCARNATION"], "1");
  second["COHORT_FT_INCARNATION"] = "0";
  EXPECT_EQ(first, second);
  // The default of --min-replicas, and none of it without the mode (an outer job's
  // values do not leak in: Note [Variables the launcher owns]).
  EXPECT_EQ(worker_environment({}, parse({"--fault-tolerance", "in-process", "prog"}), slot, ctx, "e")
                ["COHORT_FT_MIN_REPLICAS"],
            "1");
  const cohort::comm::EnvMap outer{{"COHORT_FAULT_TOLERANCE", "in-process"}, {"COHORT_FT_INCARNATION", "3"},
                                   {"COHORT_FT_MIN_REPLICAS", "2"}};
  auto plain = worker_environment(without_launcher_variables(outer), RunOptions{}, slot, ctx, "e");
  for (const char* name : {"COHORT_FAULT_TOLERANCE", "COHORT_FT_MIN_REPLICAS", "COHORT_FT_INCARNATION"})
    EXPECT_EQ(plain.count(name), 0u) << name;
}

std::string text(c10d::Store& store, const std::string& key) {
  auto bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

// Note [In-process fault tolerance: the keys], through a PrefixStore as a worker sees it.
TEST(InProcessKeys, DeathsArePublishedUnderTheWorkersPrefixInOrder) {
  auto raw = c10::make_intrusive<c10d::HashStore>();
  auto agent_view = c10::make_intrusive<c10d::PrefixStore>("/cohort/static/attempt_0/worker", raw);
  EXPECT_EQ(publish_death(*agent_view, 2, 0), 1);
  EXPECT_EQ(publish_death(*agent_view, 0, 0), 2);
  EXPECT_EQ(publish_death(*agent_view, 2, 1), 3);
  c10d::PrefixStore worker_view("/cohort/static/attempt_0/worker", raw);
  EXPECT_EQ(text(worker_view, "cohort/ft/dead/2"), "1");
  EXPECT_EQ(text(worker_view, "cohort/ft/dead/0"), "0");
  EXPECT_EQ(text(worker_view, "cohort/ft/event/1"), "dead 2 0");
  EXPECT_EQ(text(worker_view, "cohort/ft/event/2"), "dead 0 0");
  EXPECT_EQ(text(worker_view, "cohort/ft/event/3"), "dead 2 1");
  EXPECT_EQ(worker_view.add("cohort/ft/events", 0), 3);
}

TEST(InProcessKeys, TheBudgetCountsSingleWorkerRestartsOverTheJob) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  InProcessRestarts restarts(store, 1);
  WorkerOutcome dead;
  dead.slot.rank = 1;
  dead.pid = 77;
  dead.wait_status = SIGKILL;  // killed by SIGKILL, as wait() reports it
  EXPECT_EQ(restarts.on_death(dead, 0), FailureAction::kReplace);
  EXPECT_EQ(restarts.on_death(dead, 1), FailureAction::kLeave);
  EXPECT_EQ(restarts.restarts_used(), 1);
  EXPECT_EQ(restarts.not_replaced(), 1);
  EXPECT_EQ(text(*store, "cohort/ft/event/2"), "dead 1 1");
}

// Note [A restart that cannot help]: a configuration error is not replaced and costs
// no restart, but is published like any death; other errors are replaced.
TEST(InProcessKeys, AConfigurationErrorIsNotReplacedAndCostsNoRestart) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  InProcessRestarts restarts(store, 2);
  WorkerOutcome refused;
  refused.slot.rank = 2;
  refused.wait_status = 1 << 8;  // exit code 1
  refused.error = cohort::elastic::ErrorRecord{"cohort::ConfigError: replica 2 runs with configuration", "", 0};
  EXPECT_TRUE(repeats_in_a_replacement(refused));
  EXPECT_EQ(restarts.on_death(refused, 0), FailureAction::kLeave);
  EXPECT_EQ(restarts.restarts_used(), 0);
  EXPECT_EQ(restarts.not_replaced(), 1);
  EXPECT_EQ(text(*store, "cohort/ft/event/1"), "dead 2 0");
  WorkerOutcome lost = refused;
  lost.error->message = "cohort::CommError: cohort: fault tolerance: quorum 3 cannot form";
  EXPECT_FALSE(repeats_in_a_replacement(lost));
  EXPECT_EQ(restarts.on_death(lost, 0), FailureAction::kReplace);
  lost.error.reset();  // no error file: killed, or a program that does not record
  EXPECT_FALSE(repeats_in_a_replacement(lost));
  EXPECT_EQ(restarts.restarts_used(), 1);
}

// Note [A lost slot's ranks are published dead]: every incarnation the lost agents
// could have given is dead, and the next agent of the slot starts above them.
TEST(InProcessKeys, ALostSlotsRanksArePublishedDeadBelowTheNextAgentsWorkers) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  InProcessRestarts host(store, 3);
  auto vacant = [] { return true; };
  // Slot 1 was lost before its agent counted its start.
  EXPECT_TRUE(host.publish_lost_slot(1, 2, 2, vacant));
  EXPECT_EQ(text(*store, "cohort/ft/dead/2"), "3");
  EXPECT_EQ(text(*store, "cohort/ft/dead/3"), "3");
  EXPECT_EQ(text(*store, "cohort/ft/event/2"), "dead 3 3");
  EXPECT_EQ(InProcessRestarts(store, 3).first_incarnation(1), 4);
  // That agent, in turn, is lost: its incarnations 4..7 are dead too.
  EXPECT_TRUE(host.publish_lost_slot(1, 2, 2, vacant));
  EXPECT_EQ(text(*store, "cohort/ft/dead/3"), "7");
  // A newcomer took the slot while the starts were read: nothing is published, so
  // its workers (8..11) are not marked dead.
  EXPECT_EQ(InProcessRestarts(store, 3).first_incarnation(1), 8);
  EXPECT_FALSE(host.publish_lost_slot(1, 2, 2, [] { return false; }));
  EXPECT_EQ(text(*store, "cohort/ft/dead/3"), "7");
  EXPECT_EQ(store->add("cohort/ft/events", 0), 4);
  EXPECT_EQ(host.restarts_used(), 0);
}

TEST(InProcessLines, SayWhatHappenedAndWhatComesNext) {
  EXPECT_EQ(death_line(1, 0, 123, SIGKILL, 1, 2),
            "cohort run: worker 1 (incarnation 0, pid 123) was killed by SIGKILL; restarting only this worker (fault "
            "tolerance in-process, restart 1 of 2)\n");
  EXPECT_EQ(death_line(4, 2, 9, 3 << 8, 0, 2),
            "cohort run: worker 4 (incarnation 2, pid 9) exited with code 3; not replaced: --max-restarts 2 spent; the "
            "others go on\n");
  EXPECT_NE(frozen_note(1, 0, 5, 1.5).find("for over 1.5 s (--frozen-timeout); not killed"), std::string::npos);
}

}  // namespace
