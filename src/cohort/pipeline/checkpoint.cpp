#include "cohort/pipeline/checkpoint.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cohort/checkpoint/atomic_file.h"
#include "cohort/errors.h"
#include "cohort/util/json_integer.h"

namespace cohort::pipeline {

namespace fs = std::filesystem;

std::string stage_directory(const std::string& root, const Pipeline& pipeline) {
  return fmt::format("{}/stage-{}", root, pipeline.stages().front().index());
}

std::string layout_path(const std::string& root) { return root + "/pipeline.json"; }

namespace {

// The minimum and the maximum of `value` over the group, in one all-reduce.
std::pair<std::int64_t, std::int64_t> min_max(comm::Group& group, std::int64_t value, c10::Device device) {
  auto t = at::tensor(std::vector<std::int64_t>{value, -value}, at::TensorOptions().dtype(at::kLong)).to(device);
  group.all_reduce(t, comm::ReduceOp::kMin);
  auto cpu = t.cpu();
  return {cpu[0].item<std::int64_t>(), -cpu[1].item<std::int64_t>()};
}

struct Layout {
  std::int64_t ranks = 0;  // 0: no layout recorded
  std::int64_t virtual_stages = 0;
  bool operator==(const Layout& o) const { return ranks == o.ranks && virtual_stages == o.virtual_stages; }
  std::string describe() const {
    return fmt::format("{} stages ({} pipeline ranks x {} virtual stages)", ranks * virtual_stages, ranks,
                       virtual_stages);
  }
};

Layout read_layout(const std::string& path) {
  if (!fs::exists(path)) return {};
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    auto j = nlohmann::json::parse(text.str());
    Layout l{util::json_integer_at<std::int64_t>(j, "pipeline_ranks"),
             util::json_integer_at<std::int64_t>(j, "virtual_stages")};  // Note [Integers from JSON]
    if (l.ranks < 1 || l.virtual_stages < 1) throw std::invalid_argument("a count below 1");
    return l;
  } catch (const std::exception& e) {
    throw DataError(fmt::format("cohort pipeline: {} is not a pipeline layout ({}). It records which cut of the "
                                "model wrote the checkpoints beside it; restore it, or move the checkpoint "
                                "directory aside to start afresh",
                                path, e.what()));
  }
}

// Whether any stage directory under root, of any layout, holds a checkpoint.
bool any_checkpoint(const std::string& root) {
  if (!fs::is_directory(root)) return false;
  for (const auto& stage : fs::directory_iterator(root)) {
    if (!stage.is_directory() || stage.path().filename().string().rfind("stage-", 0) != 0) continue;
    for (const auto& entry : fs::directory_iterator(stage.path()))
      if (entry.path().filename().string().rfind("step-", 0) == 0) return true;
  }
  return false;
}

// Whether root holds whole-model checkpoints (root/step-N, a run without a pipeline).
bool any_whole_model_checkpoint(const std::string& root) {
  if (!fs::is_directory(root)) return false;
  for (const auto& entry : fs::directory_iterator(root))
    if (entry.is_directory() && entry.path().filename().string().rfind("step-", 0) == 0) return true;
  return false;
}

// Note [Pipeline layouts]
// Each stage's checkpoint holds only its own layers, under the whole model's names,
// so checkpoints cut for S stages cannot resume a run cut into S' stages: stage-1
// of a 2-stage cut holds what stages 1-3 of a 4-stage cut hold. Without a check the
// new stages find no checkpoint, the agreed step is "none", and every stage would
// move its good checkpoints aside and start from scratch. So the root records the
// layout, everyone's rank 0 compares it, and all ranks refuse together before
// anything on disk changes. The data-parallel width may change freely (the replicas
// of a stage hold the same weights). A run without a pipeline keeps the whole model
// in root/step-N, which no stage reads either: a pipeline run refuses those, and a
// run without a pipeline refuses stage checkpoints (refuse_pipeline_checkpoints), or
// each would start from scratch beside the other's checkpoints.
void check_layout(const std::string& root, const Layout& mine, comm::Group& everyone, c10::Device device) {
  enum Status : std::int64_t { kAgreed = 0, kOther = 1, kFailed = 2, kWholeModel = 3 };
  std::vector<std::int64_t> verdict{kAgreed, 0, 0};
  std::string failure;
  if (everyone.rank() == 0) {
    try {
      const Layout saved = read_layout(layout_path(root));
      if (any_whole_model_checkpoint(root)) {
        verdict = {kWholeModel, 0, 0};
      } else if (saved.ranks != 0 && !(saved == mine) && any_checkpoint(root)) {
        verdict = {kOther, saved.ranks, saved.virtual_stages};
      } else if (!(saved == mine)) {
        fs::create_directories(root);
        nlohmann::json j{{"format", "cohort-pipeline-layout"},
                         {"version", 1},
                         {"pipeline_ranks", mine.ranks},
                         {"virtual_stages", mine.virtual_stages},
                         {"stages", mine.ranks * mine.virtual_stages}};
        checkpoint::write_file_atomically(layout_path(root), j.dump(2) + "\n");
      }
    } catch (const std::exception& e) {
      failure = e.what();
      verdict = {kFailed, 0, 0};
    }
  }
  auto t = at::tensor(verdict, at::TensorOptions().dtype(at::kLong)).to(device);
  everyone.broadcast(t, 0);
  auto v = t.cpu();
  const auto* d = v.data_ptr<std::int64_t>();
  if (d[0] == kFailed)
    throw Error(everyone.rank() == 0 ? failure
                                     : fmt::format("cohort pipeline: rank 0 could not check {}; its log says why",
                                                   layout_path(root)));
  if (d[0] == kWholeModel)
    throw ConfigError(fmt::format(
        "cohort pipeline: the checkpoints in {} (step-N directories) were written by a run without a pipeline, "
        "which saves the whole model in one; this run is a pipeline of {}, whose stages each resume from "
        "stage-<s> directories, so it would start from scratch. Resume without a pipeline (cohort's trainer: "
        "without --pipeline-stages), or start afresh with another checkpoint directory. Nothing was moved or "
        "deleted",
        root, mine.describe()));
  if (d[0] == kOther) {
    const Layout saved{d[1], d[2]};
    throw ConfigError(fmt::format(
        "cohort pipeline: the checkpoints in {} were written by a pipeline of {}; this run has {}. Each stage's "
        "checkpoint holds only its own layers, so it cannot resume another cut of the model. Resume with the same "
        "layout (cohort's trainer: --pipeline-stages {} --virtual-stages {}), or start afresh with another "
        "checkpoint directory. Nothing was moved or deleted",
        root, saved.describe(), mine.describe(), saved.ranks, saved.virtual_stages));
  }
}

}  // namespace

std::optional<checkpoint::Restored> load_agreed(const std::string& root, const Pipeline& pipeline,
                                                checkpoint::Checkpointer& checkpointer,
                                                torch::optim::Optimizer& optimizer, comm::Group& everyone,
                                                c10::Device device) {
  check_layout(root, Layout{pipeline.schedule().ranks, pipeline.schedule().virtual_stages}, everyone, device);
  auto& model = *pipeline.local_module();
  std::optional<std::int64_t> at_most;
  // Each round either agrees or lowers the bound below a step some stage could not
  // load (it was corrupt and moved aside), so the rounds are bounded by the steps kept.
  for (int round = 0; round < 64; ++round) {
    std::int64_t newest = -1;
    for (auto step : checkpointer.steps_on_disk())
      if (!at_most || step <= *at_most) newest = std::max(newest, step);
    const auto candidate = min_max(everyone, newest, device).first;
    auto restored = checkpointer.load_latest(model, optimizer, device, candidate);
    const std::int64_t got = restored ? restored->progress.step : -1;
    const auto [low, high] = min_max(everyone, got, device);
    if (low == high) return restored;
    at_most = low;
  }
  throw Error(fmt::format("cohort pipeline: the stages' checkpoints in {} never agreed on a step to resume; move "
                          "the checkpoint directories aside to start afresh",
                          checkpointer.directory()));
}

void refuse_pipeline_checkpoints(const std::string& root) {
  if (!any_checkpoint(root)) return;
  const Layout saved = read_layout(layout_path(root));
  throw ConfigError(fmt::format(
      "cohort: the checkpoints in {} (stage-<s> directories) were written by a pipeline{}, whose stages each saved "
      "only their own layers; this run has no pipeline and resumes the whole model from step-N directories, so it "
      "would start from scratch. Resume with the same pipeline{}, or start afresh with another checkpoint "
      "directory. Nothing was moved or deleted",
      root, saved.ranks ? " of " + saved.describe() : std::string(),
      saved.ranks ? fmt::format(" (cohort's trainer: --pipeline-stages {} --virtual-stages {})", saved.ranks,
                                saved.virtual_stages)
                  : std::string()));
}

}  // namespace cohort::pipeline
