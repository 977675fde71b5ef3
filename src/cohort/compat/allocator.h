#pragma once
// c10::Allocator across LibTorch versions: allocate() is const in 1.13 and not in
// 2.x, and 2.x adds copy_data(). Derive from compat::Allocator and implement
// allocate_bytes() and copy_data(); the override of the right allocate() is here.
#include <c10/core/Allocator.h>
#include <torch/version.h>

#include <cstddef>

namespace cohort::compat {

class Allocator : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(std::size_t n) override { return allocate_bytes(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override = 0;
#else
  c10::DataPtr allocate(std::size_t n) const override { return allocate_bytes(n); }
  virtual void copy_data(void* dest, const void* src, std::size_t count) const = 0;
#endif
  virtual c10::DataPtr allocate_bytes(std::size_t n) const = 0;
};

}  // namespace cohort::compat
