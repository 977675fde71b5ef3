#include "cohort/data/fashion_mnist.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <array>

#include "cohort/data/idx_file.h"
#include "cohort/errors.h"

namespace cohort::data {
namespace {

constexpr std::int64_t kSide = 28;
constexpr const char* kHowToGet =
    "install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or "
    "pass the directory that holds the four IDX files (--data-dir)";

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Debian ships the files gzipped; a user's own copy may be unpacked.
std::string find_file(const std::string& directory, const std::string& name) {
  for (const std::string& candidate : {directory + "/" + name + ".gz", directory + "/" + name}) {
    if (exists(candidate)) return candidate;
  }
  throw DataError(fmt::format("Fashion-MNIST: {}/{}.gz is missing: {}", directory, name,
                              kHowToGet));
}

IdxArray read(const std::string& path) {
  try {
    return read_idx_file(path);
  } catch (const DataError& e) {
    throw DataError(fmt::format("Fashion-MNIST: {}; {}", e.what(), kHowToGet));
  }
}

}  // namespace

FashionMnist::FashionMnist(const std::string& directory, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string image_path = find_file(directory, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_file(directory, prefix + "-labels-idx1-ubyte");
  IdxArray images = read(image_path);
  IdxArray labels = read(label_path);
  if (images.dims.size() != 3 || images.dims[1] != kSide || images.dims[2] != kSide) {
    throw DataError(fmt::format("Fashion-MNIST: {} holds arrays of shape [{}], expected "
                                "[N, 28, 28]; {}",
                                image_path, fmt::join(images.dims, ", "), kHowToGet));
  }
  if (labels.dims.size() != 1 || labels.dims[0] != images.dims[0]) {
    throw DataError(fmt::format("Fashion-MNIST: {} has {} images but {} has labels of shape "
                                "[{}]; the two files come from different sets; {}",
                                image_path, images.dims[0], label_path,
                                fmt::join(labels.dims, ", "), kHowToGet));
  }
  for (std::size_t i = 0; i < labels.bytes.size(); ++i) {
    if (labels.bytes[i] >= kClasses) {
      throw DataError(fmt::format("Fashion-MNIST: {}: label {} of image {} is not a class "
                                  "(0..9); the file is corrupt; {}",
                                  label_path, labels.bytes[i], i, kHowToGet));
    }
  }
  const std::int64_t n = images.dims[0];
  images_ = torch::from_blob(images.bytes.data(), {n, kSide, kSide}, torch::kUInt8).clone();
  labels_ = torch::from_blob(labels.bytes.data(), {n}, torch::kUInt8).to(torch::kInt64);
}

torch::data::Example<> FashionMnist::get_batch(std::vector<std::size_t> indices) {
  const auto n = static_cast<std::size_t>(images_.size(0));
  std::vector<std::int64_t> rows(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    TORCH_CHECK(indices[i] < n, "FashionMnist: index ", indices[i], " is out of range for ", n,
                " images");
    rows[i] = static_cast<std::int64_t>(indices[i]);
  }
  auto index = torch::from_blob(rows.data(), {static_cast<std::int64_t>(rows.size())}, torch::kInt64);
  auto pixels = images_.index_select(0, index).unsqueeze(1).to(torch::kFloat32);
  auto data = pixels.div_(255.0).sub_(kMean).div_(kStd);
  return {data, labels_.index_select(0, index)};
}

c10::optional<std::size_t> FashionMnist::size() const {
  return static_cast<std::size_t>(images_.size(0));
}

const char* FashionMnist::class_name(int label) {
  static constexpr std::array<const char*, kClasses> kNames = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  TORCH_CHECK(label >= 0 && label < kClasses, "FashionMnist: no class ", label);
  return kNames[static_cast<std::size_t>(label)];
}

}  // namespace cohort::data
