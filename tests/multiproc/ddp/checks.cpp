#include "ddp/checks.h"

#include <limits>
#include <set>
#include <stdexcept>

namespace cohort::testing {

WorkerArgs parse_worker_args(int argc, char** argv) {
  WorkerArgs a;
  if (argc < 2) throw std::invalid_argument("usage: ddp_worker SCENARIO [flags]");
  a.scenario = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--model") a.model = value();
    else if (flag == "--hook") a.hook = value();
    else if (flag == "--steps") a.steps = std::stoi(value());
    else if (flag == "--micro-steps") a.micro_steps = std::stoi(value());
    else if (flag == "--cap") a.cap = std::stoll(value());
    else if (flag == "--first-cap") a.first_cap = std::stoll(value());
    else if (flag == "--view") a.view = true;
    else if (flag == "--find-unused") a.find_unused = true;
    else if (flag == "--static") a.static_graph = true;
    else if (flag == "--device") a.device = value();
    else if (flag == "--divide-by-active") a.divide_by_initial_world_size = false;
    else throw std::invalid_argument("unknown flag " + flag);
  }
  return a;
}

ddp::DistributedDataParallelOptions ddp_options(const WorkerArgs& a) {
  auto o = ddp::DistributedDataParallelOptions()
               .gradient_as_bucket_view(a.view)
               .find_unused_parameters(a.find_unused)
               .static_graph(a.static_graph);
  if (a.cap > 0) o.bucket_cap_bytes(a.cap);
  if (a.first_cap > 0) o.first_bucket_cap_bytes(a.first_cap);
  return o;
}

Batch global_batch(int step, int rows) {
  torch::manual_seed(1000 + step);
  auto x = torch::randn({rows, 20});
  auto y = torch::randn({rows, 4});
  return {x, y};
}

torch::Tensor rows_of(const torch::Tensor& t, int rank, int per_rank) { return t.narrow(0, rank * per_rank, per_rank); }

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& m) {
  std::set<const void*> seen;
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

torch::optim::SGD make_sgd(const torch::nn::Module& m) {
  return torch::optim::SGD(unique_parameters(m), torch::optim::SGDOptions(0.05).momentum(0.9));
}

namespace {
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return std::numeric_limits<double>::infinity();
  if (!a.defined()) return 0;
  return (a.cpu() - b.cpu()).abs().max().item<double>();
}
}  // namespace

double max_param_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  auto ba = a.buffers(), bb = b.buffers();
  pa.insert(pa.end(), ba.begin(), ba.end());
  pb.insert(pb.end(), bb.begin(), bb.end());
  if (pa.size() != pb.size()) return std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, max_abs_diff(pa[i].to(torch::kDouble), pb[i].to(torch::kDouble)));
  return worst;
}

double max_grad_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  if (pa.size() != pb.size()) return std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, max_abs_diff(pa[i].grad(), pb[i].grad()));
  return worst;
}

int report(const std::string& scenario, comm::World& world, double param_diff, double grad_diff, double tolerance) {
  const bool ok = param_diff <= tolerance && grad_diff <= tolerance;
  std::cout << scenario << (ok ? " ok" : " FAILED") << " rank " << world.rank() << " world " << world.size()
            << " max_param_diff " << param_diff << " max_grad_diff " << grad_diff << std::endl;
  return ok ? 0 : 1;
}

}  // namespace cohort::testing
