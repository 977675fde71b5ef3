#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "cohort/elastic/rendezvous_state.h"
#include "cohort/launcher/cli.h"
#include "cohort/launcher/run_options.h"

namespace {
using cohort::launcher::parse_run_command;
using cohort::launcher::RunOptions;
using cohort::launcher::UsageError;

RunOptions parse(std::vector<std::string> args, const cohort::comm::EnvMap& env = {}) {
  std::ostringstream help;
  auto o = parse_run_command(args, help, env);
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

TEST(Cli, StandaloneIsTheElasticRendezvousOnLoopbackWithAFreePort) {
  auto o = parse({"--standalone", "--rdzv-endpoint", "10.0.0.1:1234", "prog"});
  EXPECT_EQ(o.rdzv_backend, "c10d");
  EXPECT_EQ(o.rdzv_endpoint, "127.0.0.1:0");
}

TEST(Cli, ElasticFlags) {
  auto o = parse({"--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv_endpoint", "node0:29500", "--rdzv-id", "job7",
                  "--rdzv-conf", "join_timeout=5,last_call_timeout=1", "--max-restarts", "3", "prog"});
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.max_nodes, 4);
  EXPECT_EQ(o.run_id, "job7");
  EXPECT_EQ(o.rdzv_conf, "join_timeout=5,last_call_timeout=1");
  auto e = cohort::launcher::parse_endpoint(o.rdzv_endpoint, "--rdzv-endpoint");
  EXPECT_EQ(e.host, "node0");
  EXPECT_EQ(e.port, 29500);
  EXPECT_EQ(cohort::launcher::parse_endpoint("[::1]:7", "f").host, "::1");
  EXPECT_EQ(cohort::launcher::parse_endpoint("h", "f").port, 29400);
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
  // The elastic rendezvous.
  const std::vector<std::string> elastic{"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = elastic;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("prog");
    return args;
  };
  expect_usage_error(with({"--nnodes", "1:2:3"}), "--nnodes 1:2:3");
  expect_usage_error(with({"--nnodes", "2:1"}), "MIN 2 is greater than MAX 1");
  expect_usage_error(with({"--nnodes", "0:2"}), "at least 1");
  expect_usage_error(with({"--rdzv-conf", "join_timeout=-3"}), "join_timeout=-3");
  expect_usage_error(with({"--rdzv-conf", "last_call_timeout=0"}), "last_call_timeout=0");
  expect_usage_error(with({"--rdzv-conf", "bogus=1"}), "bogus");
  expect_usage_error(with({"--frozen-timeout", "-1"}), "--frozen-timeout");
  expect_usage_error({"--rdzv-backend", "etcd", "prog"}, "--rdzv-backend etcd");
  expect_usage_error({"--rdzv-backend", "c10d", "prog"}, "--rdzv-endpoint");
  expect_usage_error({"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:0", "prog"}, "port 0");
  expect_usage_error({"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999", "prog"}, "not a TCP port");
  expect_usage_error({"--nnodes", "1:2", "prog"}, "--rdzv-backend c10d");
  expect_usage_error({"--rdzv-endpoint", "h:5", "prog"}, "--rdzv-backend c10d");
  // Note [The workers' store]: the static launcher takes worker_store and no other key.
  expect_usage_error({"--rdzv-conf", "join_timeout=5", "prog"}, "--rdzv-conf join_timeout: belongs to the elastic");
  expect_usage_error({"--rdzv-conf", "worker_store=plain", "prog"}, "worker_store is 'cohort'");
  expect_usage_error({"--nnodes", "2", "--master-port", "5", "--rdzv-conf", "worker_store=cohort", "prog"},
                     "share node 0's c10d TCPStore");
  expect_usage_error(with({"--rdzv-conf", "worker_store=tcp"}), "worker_store is 'cohort'");
}

// Note [--rdzv-backend etcd]: torchrun's names, its etcd keys in --rdzv-conf, and a
// clear refusal of what cannot work with etcd.
TEST(Cli, EtcdBackendTakesTheMembersAndTheEtcdKeysOfRdzvConf) {
  auto o = parse({"--nnodes", "1:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379,e2:2379,https://e3:2379",
                  "--rdzv-id", "job9", "--rdzv-conf", "join_timeout=30,protocol=https,cacert=/ca.pem,user=trainer",
                  "prog"},
                 {{"COHORT_ETCD_PASSWORD", "secret"}});
  EXPECT_TRUE(cohort::launcher::is_elastic(o));
  EXPECT_TRUE(cohort::launcher::uses_etcd(o));
  EXPECT_EQ(cohort::launcher::rendezvous_conf(o), "join_timeout=30");
  const std::map<std::string, std::string> etcd{{"protocol", "https"}, {"cacert", "/ca.pem"}, {"user", "trainer"}};
  EXPECT_EQ(cohort::launcher::etcd_conf(o), etcd);
  EXPECT_TRUE(cohort::launcher::uses_etcd(
      parse({"--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "e1:2379", "--rdzv-id", "j", "prog"})));

  expect_usage_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379", "prog"},
                     "jobs without one would share the keys of `none`");
  const std::vector<std::string> base{"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379", "--rdzv-id", "j"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("prog");
    return args;
  };
  expect_usage_error({"--rdzv-backend", "etcd", "prog"}, "the etcd members' client addresses");
  expect_usage_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1", "--rdzv-id", "j", "prog"}, "'e1' in 'e1' is not host:port");
  expect_usage_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379,", "--rdzv-id", "j", "prog"}, "is not host:port");
  expect_usage_error(with({"--rdzv-conf", "worker_store=tcpstore"}), "stock c10d workers cannot speak");
  expect_usage_error(with({"--rdzv-conf", "protocol=ftp"}), "protocol=ftp is neither http nor https");
  expect_usage_error(with({"--rdzv-conf", "cert=/c.pem"}), "both a client certificate and its key");
  expect_usage_error(with({"--rdzv-conf", "bogus=1"}), "bogus");
  expect_usage_error(with({"--standalone"}), "--standalone");
  expect_usage_error({"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379", "--rdzv-id", "team/job", "prog"},
                     "--rdzv-id team/job holds a '/'");
  // An etcd key given to the c10d backend names the backend it belongs to.
  expect_usage_error({"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5", "--rdzv-conf", "cacert=/ca.pem", "prog"},
                     "belongs to the etcd rendezvous");
  expect_usage_error({"--rdzv-backend", "zookeeper", "prog"}, "--rdzv-backend zookeeper: use c10d");
}

TEST(Cli, WorkerStoreDefaultsToCohortsStoreExceptForStaticNodesThatShareATcpStore) {
  using cohort::elastic::WorkerStore;
  auto store_of = [](std::vector<std::string> args) {
    args.push_back("prog");
    auto o = parse(args);
    cohort::launcher::validate(o);
    return cohort::launcher::worker_store_of(o);
  };
  EXPECT_EQ(store_of({}), WorkerStore::kCohort);
  EXPECT_EQ(store_of({"--rdzv-conf", "worker_store=tcpstore"}), WorkerStore::kTcpStore);
  EXPECT_EQ(store_of({"--nnodes", "2", "--master-port", "5"}), WorkerStore::kTcpStore);
  EXPECT_EQ(store_of({"--standalone"}), WorkerStore::kCohort);
  EXPECT_EQ(store_of({"--standalone", "--rdzv-conf", "join_timeout=5,worker_store=tcpstore"}),
            WorkerStore::kTcpStore);
}

// Note [PET variables]: torchrun's environment form of every flag.
TEST(Cli, PetVariablesSetTheFlagsLeftOff) {
  const cohort::comm::EnvMap env{{"PET_NPROC_PER_NODE", "4"},
                                 {"PET_NNODES", "1:3"},
                                 {"PET_RDZV_BACKEND", "c10d"},
                                 {"PET_RDZV_ENDPOINT", "node0:29500"},
                                 {"PET_RDZV_ID", "job7"},
                                 {"PET_RDZV_CONF", "join_timeout=5"},
                                 {"PET_MAX_RESTARTS", "3"},
                                 {"PET_MONITOR_INTERVAL", "0.5"},
                                 {"PET_ROLE", "trainer"},
                                 {"PET_LOG_DIR", "/tmp/logs"},
                                 {"PET_TEE", "3"},
                                 {"PET_LOCAL_RANKS_FILTER", "0"},
                                 {"PET_NO_PYTHON", "1"},
                                 {"PET_START_METHOD", "spawn"}};  // torchrun's, not ours: ignored
  auto o = parse({"prog", "--nnodes", "9"}, env);
  EXPECT_EQ(o.nproc_per_node, "4");
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.max_nodes, 3);
  EXPECT_EQ(o.rdzv_backend, "c10d");
  EXPECT_EQ(o.rdzv_endpoint, "node0:29500");
  EXPECT_EQ(o.run_id, "job7");
  EXPECT_EQ(o.rdzv_conf, "join_timeout=5");
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(o.monitor_interval, 0.5);
  EXPECT_EQ(o.role, "trainer");
  EXPECT_EQ(o.log_dir, "/tmp/logs");
  EXPECT_TRUE(o.tee.stderr_for(0));
  EXPECT_EQ(*o.local_ranks_filter, (std::set<int>{0}));
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--nnodes", "9"})) << "the program's arguments stay its own";
}

TEST(Cli, FlagsTakePrecedenceOverPetVariables) {
  const cohort::comm::EnvMap env{{"PET_NPROC_PER_NODE", "4"}, {"PET_MASTER_PORT", "29511"}, {"PET_NNODES", "2"},
                                 {"PET_NODE_RANK", "1"}, {"PET_MASTER_ADDR", "10.0.0.1"}, {"PET_MAX_RESTARTS", ""}};
  auto o = parse({"--nproc_per_node", "2", "--node-rank=0", "prog"}, env);
  EXPECT_EQ(o.nproc_per_node, "2");
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.max_nodes, 2);
  EXPECT_EQ(o.master_port, 29511);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.max_restarts, 0) << "an empty variable counts as unset";
  auto standalone = parse({"prog"}, {{"PET_STANDALONE", "1"}});
  EXPECT_TRUE(standalone.standalone);
  EXPECT_EQ(standalone.rdzv_backend, "c10d");
  EXPECT_FALSE(parse({"prog"}, {{"PET_STANDALONE", "0"}}).standalone);
  EXPECT_EQ(parse({"prog"}, {}).nproc_per_node, "1");
}

void expect_env_error(const cohort::comm::EnvMap& env, const std::vector<std::string>& mentions) {
  std::ostringstream help;
  try {
    parse_run_command({"prog"}, help, env);
    ADD_FAILURE() << "accepted: " << ::testing::PrintToString(env);
  } catch (const UsageError& e) {
    for (const auto& m : mentions) EXPECT_NE(std::string(e.what()).find(m), std::string::npos) << e.what();
  }
}

TEST(Cli, BadPetValuesNameTheVariable) {
  expect_env_error({{"PET_MAX_RESTARTS", "three"}}, {"PET_MAX_RESTARTS=three", "--max-restarts"});
  expect_env_error({{"PET_MAX_RESTARTS", "-1"}}, {"PET_MAX_RESTARTS=-1", "must be 0 or more"});
  expect_env_error({{"PET_NNODES", "3:1"}}, {"PET_NNODES=3:1", "MIN 3 is greater than MAX 1"});
  expect_env_error({{"PET_NPROC_PER_NODE", "0"}}, {"PET_NPROC_PER_NODE=0"});
  expect_env_error({{"PET_MONITOR_INTERVAL", "soon"}}, {"PET_MONITOR_INTERVAL=soon"});
  expect_env_error({{"PET_STANDALONE", "maybe"}}, {"PET_STANDALONE=maybe"});
  expect_env_error({{"PET_RDZV_BACKEND", "zookeeper"}}, {"PET_RDZV_BACKEND=zookeeper", "--rdzv-backend zookeeper"});
  expect_env_error({{"PET_TEE", "9"}}, {"PET_TEE=9"});
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
