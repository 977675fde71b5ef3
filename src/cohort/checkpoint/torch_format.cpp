#include "cohort/checkpoint/torch_format.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>

#include "cohort/checkpoint/pickle_stack.h"
#include "cohort/errors.h"

namespace cohort::checkpoint {
namespace {

// Note [Bounded reads of torch.save files]
// torch::pickle_load(std::vector<char>) reads through LibTorch's VectorReader, which
// copies whatever range miniz asks for without checking it against the buffer: a
// file whose zip directory points past its end made LibTorch 1.13 read out of bounds
// (a SEGV found by fuzz_checkpoint_pickle). So cohort opens the archive itself, with
// a reader that clips every read to the bytes there are; miniz then sees a short read
// and PyTorchStreamReader throws. The rest is what pickle_load does.
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(const std::string& bytes) : bytes_(bytes) {}
  std::size_t size() const override { return bytes_.size(); }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, bytes_.size() - pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;  // outlives the reader: both live in torch_load_bytes
};

}  // namespace

std::string torch_save_bytes(const c10::IValue& value) {
  std::string pickled;
  torch::jit::Pickler pickler([&](const char* data, std::size_t size) { pickled.append(data, size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);  // Note [Untagged pickles]
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, std::size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

c10::IValue torch_load_bytes(const std::string& bytes, const std::string& source) {
  std::string why;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::make_shared<BoundedReader>(bytes));
    {
      auto [pickle, size] = archive.getRecord("data.pkl");  // Note [Pickles that underflow the stack]
      check_pickle_stack(static_cast<const char*>(pickle.get()), size, source);
    }
    return torch::jit::readArchiveAndTensors("data", /*pickle_prefix=*/"", /*tensor_prefix=*/"",
                                             /*type_resolver=*/{}, /*obj_loader=*/{}, /*device=*/{}, archive);
  } catch (const DataError&) {
    throw;
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  } catch (const std::exception& e) {
    why = e.what();
  }
  throw DataError(fmt::format("{}: cannot be read as a file of torch.save ({}); it is corrupt or of another kind",
                              source, why));
}

}  // namespace cohort::checkpoint
