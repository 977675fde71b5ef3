// Started by tests/multiproc/tensor_parallel_test.cpp through `cohort run`: every
// rank of the world is one TP rank. Each trains a ParallelTransformerBlock split
// over the world with dropout, and in the same process the same block over a group
// of one (this rank alone: no collective, every mask drawn whole), from the same
// seeds. Real processes have a generator each, so this proves what threads cannot:
// the ranks' dropout masks are the one process's (Note [Dropout as one process draws
// it]). Prints "tp <variant> ok rank R ..." when outputs, the input's gradients and
// the weights after SGD steps agree, and exits 1 otherwise.
//   tp_worker plain|sequence_parallel
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "cohort/comm/world.h"
#include "cohort/tensor_parallel/block.h"

namespace {

using namespace cohort::tensor_parallel;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tp_worker plain|sequence_parallel\n";
    return 2;
  }
  const std::string variant = argv[1];
  const bool sp = variant == "sequence_parallel";
  torch::set_num_threads(1);
  auto world = cohort::comm::World::init();
  const int r = world.rank(), n = world.size();
  // Every rank creates every group of one (new_group is collective) and keeps its own.
  cohort::comm::Group alone;
  for (int q = 0; q < n; ++q) {
    auto g = world.new_group({q});
    if (q == r) alone = g;
  }
  const double p = 0.2;
  auto options = ParallelTransformerBlockOptions(16, 4).dropout(p).sequence_parallel(sp);
  torch::manual_seed(5);
  ParallelTransformerBlock whole(alone, ParallelTransformerBlockOptions(16, 4).dropout(p));
  torch::manual_seed(5);
  ParallelTransformerBlock tp(world.group(), options);
  torch::optim::SGD whole_opt(whole->parameters(), 0.1), tp_opt(tp->parameters(), 0.1);

  double out_diff = 0, grad_diff = 0;
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(100 + step);
    auto x = torch::randn({2, 8, 16});
    auto mine = sp ? x.chunk(n, kSequenceDim)[r].clone() : x.clone();
    mine.requires_grad_();
    auto xw = x.clone().requires_grad_();
    torch::manual_seed(200 + step);  // the same dropout draws on both sides
    auto y = whole(xw);
    torch::manual_seed(200 + step);
    auto y_tp = tp(mine);
    whole_opt.zero_grad();
    tp_opt.zero_grad();
    y.pow(2).mean().backward();
    // Under sequence parallelism the loss is the sum of the ranks' shards' parts.
    (y_tp.pow(2).sum() / static_cast<double>(y.numel())).backward();
    if (sp) sum_replicated_gradients(*tp, world.group());
    out_diff = std::max(out_diff, max_diff(y_tp, sp ? y.chunk(n, kSequenceDim)[r] : y));
    grad_diff = std::max(grad_diff, max_diff(mine.grad(), sp ? xw.grad().chunk(n, kSequenceDim)[r] : xw.grad()));
    whole_opt.step();
    tp_opt.step();
  }
  // The weights after the steps: TP slices against the whole model's.
  const auto c0 = tp->fc1->first_output(), c1 = tp->fc1->last_output();
  double weight_diff = std::max({max_diff(tp->fc1->weight, whole->fc1->weight.slice(0, c0, c1)),
                                 max_diff(tp->fc2->weight, whole->fc2->weight.slice(1, c0, c1)),
                                 max_diff(tp->ln1->weight, whole->ln1->weight),
                                 max_diff(tp->fc2->bias, whole->fc2->bias)});
  const bool ok = out_diff < 1e-5 && grad_diff < 1e-5 && weight_diff < 1e-5;
  std::cout << "tp " << variant << (ok ? " ok" : " FAILED") << " rank " << r << " world " << n << " max_out_diff "
            << out_diff << " max_input_grad_diff " << grad_diff << " max_weight_diff " << weight_diff << std::endl;
  return ok ? 0 : 1;
}
