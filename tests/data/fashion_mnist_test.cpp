// The IDX reader and the Fashion-MNIST dataset, on Debian's real files and on small
// files made here (valid, truncated, bit-flipped, mislabelled).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/data/fashion_mnist.h"
#include "cohort/data/idx_file.h"
#include "cohort/errors.h"
#include "support/idx_writer.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using cohort::data::FashionMnist;
using cohort::testing::idx_bytes;
using cohort::testing::TempDir;
using cohort::testing::write_gz;

namespace {

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A tiny set of `n` images whose pixels are all (image index * 10), labels i % 10.
void write_tiny_set(const std::string& dir, const std::string& prefix, int n, bool gz) {
  std::vector<std::uint8_t> pixels, labels;
  for (int i = 0; i < n; ++i) {
    pixels.insert(pixels.end(), 28 * 28, static_cast<std::uint8_t>(i * 10));
    labels.push_back(static_cast<std::uint8_t>(i % 10));
  }
  const auto images = idx_bytes({n, 28, 28}, pixels);
  const auto labs = idx_bytes({n}, labels);
  if (gz) {
    write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", images);
    write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", labs);
  } else {
    write_plain(dir + "/" + prefix + "-images-idx3-ubyte", images);
    write_plain(dir + "/" + prefix + "-labels-idx1-ubyte", labs);
  }
}

// Runs `make`, expecting a DataError whose message holds every one of `parts`.
template <typename F>
void expect_data_error(F make, const std::vector<std::string>& parts) {
  try {
    make();
    ADD_FAILURE() << "no error";
  } catch (const cohort::DataError& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "'" << part << "' not in: " << e.what();
  }
}

}  // namespace

TEST(FashionMnist, ReadsDebiansFiles) {
  FashionMnist train(FashionMnist::kDefaultDirectory, FashionMnist::Split::kTrain);
  FashionMnist test(FashionMnist::kDefaultDirectory, FashionMnist::Split::kTest);
  ASSERT_EQ(train.size().value(), 60000u);
  ASSERT_EQ(test.size().value(), 10000u);
  EXPECT_EQ(train.images().sizes(), (std::vector<std::int64_t>{60000, 28, 28}));
  // The published set is balanced: 6000 training and 1000 test images per class.
  EXPECT_TRUE(torch::bincount(train.labels()).eq(6000).all().item<bool>());
  EXPECT_TRUE(torch::bincount(test.labels()).eq(1000).all().item<bool>());
  // kMean and kStd normalise the training set to about zero mean and unit variance.
  auto all = train.get_batch(std::vector<std::size_t>{0, 1, 2, 3}).data;
  EXPECT_EQ(all.sizes(), (std::vector<std::int64_t>{4, 1, 28, 28}));
  auto pixels = train.images().to(torch::kFloat64).div(255.0);
  auto normalised = (pixels - FashionMnist::kMean) / FashionMnist::kStd;
  EXPECT_NEAR(normalised.mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(normalised.std().item<double>(), 1.0, 1e-3);
}

TEST(FashionMnist, BatchesSelectImagesAndLabels) {
  TempDir temp("cohort-fmnist");
  const auto& dir = temp.path;
  write_tiny_set(dir, "train", 5, /*gz=*/true);
  FashionMnist set(dir, FashionMnist::Split::kTrain);
  auto batch = set.get_batch({3, 1});
  EXPECT_EQ(batch.target.dtype(), torch::kInt64);
  EXPECT_EQ(batch.target[0].item<std::int64_t>(), 3);
  EXPECT_EQ(batch.target[1].item<std::int64_t>(), 1);
  const double expected = (30.0 / 255.0 - FashionMnist::kMean) / FashionMnist::kStd;
  EXPECT_NEAR(batch.data[0].max().item<double>(), expected, 1e-6);
  EXPECT_NEAR(batch.data[0].min().item<double>(), expected, 1e-6);
  EXPECT_THROW(set.get_batch({5}), c10::Error);
}

TEST(FashionMnist, ReadsUnpackedFiles) {
  TempDir temp("cohort-fmnist");
  const auto& dir = temp.path;
  write_tiny_set(dir, "t10k", 3, /*gz=*/false);
  FashionMnist set(dir, FashionMnist::Split::kTest);
  EXPECT_EQ(set.size().value(), 3u);
  EXPECT_EQ(set.images()[2][5][5].item<int>(), 20);
}

TEST(FashionMnist, MissingFilesSayHowToGetThem) {
  expect_data_error([] { FashionMnist("/nonexistent/fmnist", FashionMnist::Split::kTrain); },
                    {"/nonexistent/fmnist/train-images-idx3-ubyte.gz", "is missing",
                     "dataset-fashion-mnist", "--data-dir"});
}

TEST(FashionMnist, TruncatedFileIsNamed) {
  TempDir temp("cohort-fmnist");
  const auto& dir = temp.path;
  const std::string src = std::string(FashionMnist::kDefaultDirectory) + "/t10k-images-idx3-ubyte.gz";
  const std::string bytes = read_plain(src);
  fs::copy(std::string(FashionMnist::kDefaultDirectory) + "/t10k-labels-idx1-ubyte.gz", dir);
  write_plain(dir + "/t10k-images-idx3-ubyte.gz", bytes.substr(0, bytes.size() / 2));
  expect_data_error([&] { FashionMnist(dir, FashionMnist::Split::kTest); },
                    {dir + "/t10k-images-idx3-ubyte.gz", "truncated"});
}

TEST(FashionMnist, FlippedBitFailsTheCheck) {
  TempDir temp("cohort-fmnist");
  const auto& dir = temp.path;
  std::string bytes = read_plain(std::string(FashionMnist::kDefaultDirectory) + "/t10k-labels-idx1-ubyte.gz");
  fs::copy(std::string(FashionMnist::kDefaultDirectory) + "/t10k-images-idx3-ubyte.gz", dir);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
  write_plain(dir + "/t10k-labels-idx1-ubyte.gz", bytes);
  expect_data_error([&] { FashionMnist(dir, FashionMnist::Split::kTest); },
                    {dir + "/t10k-labels-idx1-ubyte.gz", "corrupt"});
}

TEST(FashionMnist, WrongContentIsNamed) {
  TempDir temp("cohort-fmnist");
  const auto& dir = temp.path;
  // Not IDX at all.
  write_plain(dir + "/x", "hello, this is not an IDX file");
  expect_data_error([&] { cohort::data::read_idx_file(dir + "/x"); }, {dir + "/x", "not an IDX"});
  // More data than the header says.
  write_plain(dir + "/y", idx_bytes({2}, {1, 2, 3}));
  expect_data_error([&] { cohort::data::read_idx_file(dir + "/y"); }, {"more bytes"});
  // Images and labels of different lengths.
  write_tiny_set(dir, "train", 4, true);
  write_gz(dir + "/train-labels-idx1-ubyte.gz", idx_bytes({3}, {0, 1, 2}));
  expect_data_error([&] { FashionMnist(dir, FashionMnist::Split::kTrain); }, {"different sets"});
  // A label that is not a class.
  write_gz(dir + "/train-labels-idx1-ubyte.gz", idx_bytes({4}, {0, 1, 12, 2}));
  expect_data_error([&] { FashionMnist(dir, FashionMnist::Split::kTrain); }, {"label 12 of image 2"});
  // Images of the wrong size.
  write_gz(dir + "/train-images-idx3-ubyte.gz", idx_bytes({4, 2, 2}, std::vector<std::uint8_t>(16)));
  expect_data_error([&] { FashionMnist(dir, FashionMnist::Split::kTrain); }, {"[N, 28, 28]"});
}

// Note [Check the header before allocating] in idx_file.cpp: a 16-byte file whose header
// announces 2^31 elements is refused from its size, without a 2 GiB allocation.
TEST(FashionMnist, ABogusHeaderIsRefusedBeforeAnyAllocation) {
  TempDir temp("cohort-fmnist");
  const auto& dir = temp.path;
  const auto header = idx_bytes({2048, 1024, 1024}, {});
  ASSERT_EQ(header.size(), 16u);
  write_plain(dir + "/plain", header);
  write_gz(dir + "/packed.gz", header);
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  expect_data_error([&] { cohort::data::read_idx_file(dir + "/plain"); },
                    {dir + "/plain", "announces 2147483648 elements", "16 bytes", "at most 0"});
  expect_data_error([&] { cohort::data::read_idx_file(dir + "/packed.gz"); },
                    {dir + "/packed.gz", "announces 2147483648 elements", "gzipped file"});
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  // ru_maxrss is in KiB: the peak may not have grown by anything like 2 GiB.
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "the reader allocated for the bogus header";
}
