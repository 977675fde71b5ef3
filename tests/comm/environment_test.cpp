#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cohort/comm/environment.h"
#include "cohort/comm/slurm.h"
#include "cohort/errors.h"
#include "cohort/store/etcd_options.h"

namespace {
using namespace cohort::comm;

TEST(Environment, NothingSetIsAWorldOfOneWithoutNetwork) {
  auto w = world_info_from({{"PATH", "/bin"}});
  EXPECT_EQ(w.source, WorldSource::kSingle);
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_TRUE(w.master_addr.empty());
}

TEST(Environment, Torchrun) {
  auto w = world_info_from({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                            {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"},
                            {"TORCHELASTIC_RUN_ID", "j"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                            {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(w.source, WorldSource::kTorchrun);
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.num_nodes, 2);
  EXPECT_EQ(w.master_addr, "node0");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_TRUE(w.use_agent_store);
  EXPECT_EQ(w.restart_count, 2);
  EXPECT_EQ(w.run_id, "j");
  EXPECT_FALSE(w.single_node());
}

// Note [Workers find etcd through their environment]: what an agent under
// --rdzv-backend etcd gives its workers leads them to the agents' own etcd options.
TEST(Environment, UnderEtcdTheWorkersStoreIsTheJobsEtcd) {
  auto env = cohort::store::etcd_worker_variables("e1:2379,e2:2379", {{"protocol", "https"}, {"cacert", "/ca.pem"},
                                                                      {"user", "trainer"}, {"join_timeout", "9"}});
  EXPECT_EQ(env.at("COHORT_AGENT_STORE"), "etcd");
  EXPECT_EQ(env.at("COHORT_ETCD_CONF"), "cacert=/ca.pem,protocol=https,user=trainer") << "only etcd's keys";
  for (auto [name, value] : std::map<std::string, std::string>{
           {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "e1"}, {"MASTER_PORT", "2379"},
           {"TORCHELASTIC_RUN_ID", "job7"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
           {"COHORT_STORE_PREFIX", "/cohort/job7/round_0/worker"}, {"COHORT_ETCD_PASSWORD", "secret"}})
    env[name] = value;
  auto w = world_info_from(env);  // checks them: Note [A worker's etcd store]
  EXPECT_TRUE(w.use_agent_store);
  EXPECT_FALSE(w.cohort_agent_store);
  EXPECT_EQ(w.store_prefix, "/cohort/job7/round_0/worker");
  const auto etcd = cohort::store::etcd_options_from_worker_env(env);
  EXPECT_EQ(etcd.endpoints(), (std::vector<std::string>{"https://e1:2379", "https://e2:2379"}));
  EXPECT_EQ(etcd.prefix(), "cohort/job7/") << "the agents' prefix";
  EXPECT_EQ(etcd.user(), "trainer");
  EXPECT_EQ(etcd.password(), "secret");
  EXPECT_EQ(etcd.certificates().ca_file, "/ca.pem");
  // Each missing piece is named.
  auto without = [&](const std::string& name) {
    auto e = env;
    e.erase(name);
    return e;
  };
  for (const auto& [name, mention] : std::map<std::string, std::string>{
           {"COHORT_ETCD_ENDPOINTS", "COHORT_ETCD_ENDPOINTS is empty"},
           {"COHORT_ETCD_PASSWORD", "COHORT_ETCD_PASSWORD is not set"},
           {"TORCHELASTIC_RUN_ID", "needs a run id"}}) {
    try {
      world_info_from(without(name));
      ADD_FAILURE() << "accepted without " << name;
    } catch (const cohort::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  }
  env["COHORT_ETCD_CONF"] = "bogus=1";
  EXPECT_THROW(world_info_from(env), cohort::ConfigError);
}

TEST(Environment, HandWrittenRankAndWorldSizeAssumeOneNode) {
  auto w = world_info_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_FALSE(w.use_agent_store);
  // ... but a remote MASTER_ADDR may mean several hosts: no loopback-only transport.
  EXPECT_FALSE(w.all_on_this_host());
  auto local = world_info_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}});
  EXPECT_TRUE(local.all_on_this_host());
  auto told = world_info_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                               {"MASTER_PORT", "1"}});
  EXPECT_TRUE(told.all_on_this_host());
}

TEST(Environment, Slurm) {
  auto w = world_info_from({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                            {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
                            {"SLURM_JOB_NODELIST", "gpu[07-08]"}, {"SLURM_JOB_ID", "1234"}});
  EXPECT_EQ(w.source, WorldSource::kSlurm);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.num_nodes, 2);
  EXPECT_EQ(w.master_addr, "gpu07");
  EXPECT_GE(w.master_port, 15000);
  // Every task of the step derives the same port.
  auto w0 = world_info_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "0"},
                             {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                             {"SLURM_JOB_ID", "1234"}});
  EXPECT_EQ(w0.master_port, w.master_port);
}

TEST(Environment, TorchrunVariablesWinOverSlurm) {
  auto w = world_info_from({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(w.source, WorldSource::kTorchrun);
}

TEST(Environment, OpenMpi) {
  auto w = world_info_from({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                            {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "4000"}});
  EXPECT_EQ(w.source, WorldSource::kOpenMpi);
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.num_nodes, 2);
  EXPECT_EQ(w.master_addr, "h0");
  auto local = world_info_from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"OMPI_MCA_ess_base_jobid", "777"}});
  EXPECT_EQ(local.master_addr, "127.0.0.1");
  EXPECT_GE(local.master_port, 15000);
  // Open MPI 5 (PRRTE) names the job in PMIX_NAMESPACE instead.
  auto prrte = world_info_from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"PMIX_NAMESPACE", "prterun-vm-4006@1"}});
  EXPECT_EQ(prrte.run_id, "prterun-vm-4006@1");
  EXPECT_GE(prrte.master_port, 15000);
}

void expect_config_error(const EnvMap& env, const std::string& mention) {
  try {
    world_info_from(env);
    ADD_FAILURE() << "accepted";
  } catch (const cohort::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

TEST(Environment, BadVariablesAreNamed) {
  expect_config_error({{"RANK", "0"}}, "WORLD_SIZE");
  expect_config_error({{"WORLD_SIZE", "4"}}, "RANK is not set, but WORLD_SIZE is set");
  // Zero sizes are errors, never a division by zero.
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "0"}, {"MASTER_ADDR", "h"},
                       {"MASTER_PORT", "1"}},
                      "local world size 0");
  expect_config_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "0"}}, "SLURM_NNODES=0");
  expect_config_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "0"}},
                      "local world size 0");
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}, "out of range");
  expect_config_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK");
  expect_config_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}, "rank 2");
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR");
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, "MASTER_PORT");
  expect_config_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}},
                      "99999");
  expect_config_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                      "MASTER_ADDR");
}

TEST(Slurm, Hostlists) {
  using cohort::comm::slurm::expand_hostlist;
  EXPECT_EQ(expand_hostlist("a"), (std::vector<std::string>{"a"}));
  EXPECT_EQ(expand_hostlist("n[01-03,07],gpu-a"),
            (std::vector<std::string>{"n01", "n02", "n03", "n07", "gpu-a"}));
  EXPECT_EQ(expand_hostlist("r[1-2]-n[8-9]"), (std::vector<std::string>{"r1-n8", "r1-n9", "r2-n8", "r2-n9"}));
  EXPECT_EQ(expand_hostlist("x[9-11]"), (std::vector<std::string>{"x9", "x10", "x11"}));
  EXPECT_THROW(expand_hostlist("n[1-2"), cohort::ConfigError);
  EXPECT_THROW(expand_hostlist("n[5-2]"), cohort::ConfigError);
}

TEST(Slurm, TasksPerNode) {
  using cohort::comm::slurm::expand_tasks_per_node;
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_THROW(expand_tasks_per_node("2(x"), cohort::ConfigError);
}

// Found by fuzz_launcher_env: a short list that expands to billions of names hung the
// worker and exhausted its memory (Note [Bounded SLURM lists]). Now it is refused.
TEST(Slurm, ListsThatExpandBeyondAnyJobAreRefused) {
  using cohort::comm::slurm::expand_hostlist;
  using cohort::comm::slurm::expand_tasks_per_node;
  EXPECT_EQ(expand_hostlist("n[1-65536]").size(), 65536u);
  EXPECT_THROW(expand_hostlist("n[0-99999999999]"), cohort::ConfigError);
  EXPECT_THROW(expand_hostlist("a[1-1000]b[1-1000]c[1-1000]"), cohort::ConfigError);
  EXPECT_THROW(expand_hostlist("\x8b[15-222503,0]x[1-9],r[1-2]-n[1-2]"), cohort::ConfigError);
  // Note [Bounded SLURM lists]: the steps are bounded too, not only the names. Empty
  // brackets after a large product gave no name after 51 million steps, and a chain
  // of one-name groups after a 65536-name product would copy each name 1000 times.
  EXPECT_THROW(expand_hostlist("a[0-370]b[0-370]c[0-370][]"), cohort::ConfigError);
  std::string doubled;
  for (int i = 0; i < 16; ++i) doubled += "a[0-1]";
  EXPECT_EQ(expand_hostlist(doubled).size(), 65536u);  // 16 groups: within the bound
  std::string chained = doubled;
  for (int i = 0; i < 1000; ++i) chained += "[0]";
  EXPECT_THROW(expand_hostlist(chained), cohort::ConfigError);
  EXPECT_EQ(expand_hostlist("rack[1-4]-node[01-32]").size(), 128u);
  EXPECT_EQ(expand_tasks_per_node("1(x65535),2").size(), 65536u);
  EXPECT_THROW(expand_tasks_per_node("2(x99999999999)"), cohort::ConfigError);
  EXPECT_THROW(expand_tasks_per_node("1(x65536),1"), cohort::ConfigError);
  EXPECT_THROW(expand_tasks_per_node("1(x-2)"), cohort::ConfigError);
}

// A negative SLURM_NODEID read before the start of the tasks-per-node list.
TEST(Environment, NegativeSlurmNodeIdIsRefused) {
  EXPECT_THROW(world_info_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "-1"},
                                {"SLURM_TASKS_PER_NODE", "1(x2)"}, {"SLURM_JOB_NODELIST", "n[1-2]"}}),
               cohort::ConfigError);
}

}  // namespace
