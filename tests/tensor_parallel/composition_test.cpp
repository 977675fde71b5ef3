// Which strategies compose with tensor parallelism: what check_composition accepts
// is what tests/multiproc/tensor_parallel_gpt_test.cpp proves equal to one process;
// what it refuses names the combination and the alternative.
#include <gtest/gtest.h>

#include <string>

#include "cohort/errors.h"
#include "cohort/tensor_parallel/composition.h"

namespace {

using cohort::tensor_parallel::check_composition;
using cohort::tensor_parallel::Composition;

std::string refusal(const Composition& c) {
  try {
    check_composition(c);
  } catch (const cohort::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallelComposition, AcceptsWhatTheProcessTestsProve) {
  for (int zero : {0, 1, 2, 3}) EXPECT_NO_THROW(check_composition(Composition().data(2).tensor(2).zero(zero)));
  for (int zero : {0, 1, 2}) {
    EXPECT_NO_THROW(check_composition(Composition().data(2).tensor(2).zero(zero).sequence_parallel(true)));
  }
  EXPECT_NO_THROW(check_composition(Composition().pipeline(2).tensor(2).sequence_parallel(true)));
  EXPECT_NO_THROW(check_composition(Composition().data(2).pipeline(2).tensor(2).sequence_parallel(true)));
  EXPECT_NO_THROW(check_composition(Composition().data(2).pipeline(2).tensor(2).zero(1)));
  // ZeRO-3 with "sequence parallelism" over a TP group of one shards nothing.
  EXPECT_NO_THROW(check_composition(Composition().data(2).zero(3).sequence_parallel(true)));
}

TEST(TensorParallelComposition, RefusesZero2And3WithAPipeline) {
  for (int zero : {2, 3}) {
    const auto why = refusal(Composition().data(2).pipeline(2).tensor(2).zero(zero));
    EXPECT_NE(why.find("dp 2 x pp 2 x tp 2 with ZeRO-" + std::to_string(zero) + " is not supported"), std::string::npos)
        << why;
    EXPECT_NE(why.find("use ZeRO-1 or DDP"), std::string::npos) << why;
  }
}

TEST(TensorParallelComposition, RefusesZero3WithSequenceParallelism) {
  const auto why = refusal(Composition().data(2).tensor(2).zero(3).sequence_parallel(true));
  EXPECT_NE(why.find("ZeRO-3 and sequence parallelism is not supported"), std::string::npos) << why;
  EXPECT_NE(why.find("turn sequence parallelism off, or use ZeRO-1/2 or DDP"), std::string::npos) << why;
}

TEST(TensorParallelComposition, RefusesWhatDoesNotExist) {
  EXPECT_NE(refusal(Composition().zero(4)).find("ZeRO stage 4 does not exist"), std::string::npos);
  EXPECT_NE(refusal(Composition().tensor(0)).find("at least 1"), std::string::npos);
}

}  // namespace
