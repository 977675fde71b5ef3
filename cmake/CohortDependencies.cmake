# Finds what cohort builds on. LibTorch comes from CMAKE_PREFIX_PATH when the user
# passes their own (the official zip, or pip's torch.utils.cmake_prefix_path), and
# from Debian's libtorch-dev otherwise.
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)
# libssl and libcrypto: the store's TLS 1.3 with a key derived from the token.
find_package(OpenSSL REQUIRED COMPONENTS SSL Crypto)
find_package(CLI11 QUIET CONFIG)
if(NOT CLI11_FOUND)
  find_path(COHORT_CLI11_INCLUDE CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${COHORT_CLI11_INCLUDE})
endif()

# LibTorch's CMake config lists libraries but not a target with usage requirements
# on every version, so wrap it in one.
if(NOT TARGET cohort_torch)
  add_library(cohort_torch INTERFACE)
  target_link_libraries(cohort_torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(cohort_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  # pip's and the official LibTorch are built with the pre-C++11 ABI flag set
  # explicitly; TORCH_CXX_FLAGS carries it.
  separate_arguments(COHORT_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(cohort_torch INTERFACE ${COHORT_TORCH_CXX_FLAGS})
endif()

# Which c10d backends this LibTorch has. Gloo is in every Linux build we support;
# NCCL only in CUDA builds, MPI only where PyTorch was built against an MPI.
set(COHORT_HAVE_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR CUDA_FOUND OR CUDAToolkit_FOUND)
  foreach(dir ${TORCH_INCLUDE_DIRS})
    if(EXISTS "${dir}/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp")
      set(COHORT_HAVE_NCCL ON)
    endif()
  endforeach()
endif()
message(STATUS "cohort: LibTorch ${Torch_VERSION}, NCCL backend: ${COHORT_HAVE_NCCL}")
