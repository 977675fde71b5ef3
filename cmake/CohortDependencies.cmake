# Finds what cohort builds on. LibTorch comes from CMAKE_PREFIX_PATH when the user
# passes their own (the official zip, or pip's torch.utils.cmake_prefix_path), and
# from Debian's libtorch-dev otherwise.
#
# Note [pip's LibTorch beside Debian's]: TorchConfig.cmake looks libtorch and libc10
# up with find_library(... PATHS <its prefix>/lib), and find_library tries the
# system's directories before PATHS: on a machine that also has Debian's
# libtorch-dev, pip's torch would link Debian's libc10 1.13 next to its own. A
# prefix given as pip's torch.utils.cmake_prefix_path (<torch>/share/cmake) or as
# Torch_DIR (<torch>/share/cmake/Torch), here or in the environment, puts <torch>/lib
# first on the search.
set(_cohort_library_path "${CMAKE_LIBRARY_PATH}")
string(REPLACE ":" ";" _cohort_env_prefix "$ENV{CMAKE_PREFIX_PATH}")
foreach(_cohort_dir IN LISTS CMAKE_PREFIX_PATH _cohort_env_prefix Torch_DIR)
  foreach(_cohort_up "" "/.." "/../..")
    get_filename_component(_cohort_root "${_cohort_dir}${_cohort_up}" ABSOLUTE)
    if(EXISTS "${_cohort_root}/share/cmake/Torch/TorchConfig.cmake" AND EXISTS "${_cohort_root}/lib")
      list(PREPEND CMAKE_LIBRARY_PATH "${_cohort_root}/lib")
    endif()
  endforeach()
endforeach()
find_package(Torch REQUIRED)
set(CMAKE_LIBRARY_PATH "${_cohort_library_path}")
# Note [The wheel's nvidia libraries at link time]: pip's libtorch_cuda.so finds its
# NCCL and the other nvidia-* libraries through its RUNPATH
# ($ORIGIN/../../nvidia/<name>/lib), which GNU ld does not follow when it resolves a
# shared library's own dependencies: it took the CUDA toolkit's older libnccl.so.2
# and missed 2.15's newer NCCL symbols. -rpath-link names those folders for the link.
file(GLOB _cohort_nvidia_libs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
foreach(_cohort_dir IN LISTS _cohort_nvidia_libs)
  add_link_options("LINKER:-rpath-link,${_cohort_dir}")
endforeach()
# Refuse a mix (a cache made before this note, say): a library LibTorch's own lib/
# has but that was found elsewhere.
foreach(_cohort_lib IN LISTS TORCH_LIBRARY c10_LIBRARY)
  get_filename_component(_cohort_lib_name "${_cohort_lib}" NAME)
  if(_cohort_lib AND EXISTS "${TORCH_INSTALL_PREFIX}/lib/${_cohort_lib_name}")
    get_filename_component(_cohort_lib_real "${_cohort_lib}" REALPATH)
    get_filename_component(_cohort_want_real "${TORCH_INSTALL_PREFIX}/lib/${_cohort_lib_name}" REALPATH)
    if(NOT _cohort_lib_real STREQUAL _cohort_want_real)
      message(FATAL_ERROR "cohort: LibTorch in ${TORCH_INSTALL_PREFIX}, but ${_cohort_lib} comes "
        "from elsewhere (Note [pip's LibTorch beside Debian's] in ${CMAKE_CURRENT_LIST_FILE}): "
        "configure a fresh build directory")
    endif()
  endif()
endforeach()
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)
# libssl and libcrypto: the store's TLS 1.3 with a key derived from the token.
find_package(OpenSSL REQUIRED COMPONENTS SSL Crypto)
# libcurl: the etcd store's HTTP/JSON client of etcd's v3 API (store/etcd_client.cpp).
if(COHORT_WITH_ETCD)
  find_package(CURL)
  if(NOT CURL_FOUND)
    message(FATAL_ERROR "cohort: libcurl not found, which the etcd store needs (docs/etcd.md): install "
      "libcurl4-openssl-dev (scripts/install-deps does), or configure with -DCOHORT_WITH_ETCD=OFF")
  endif()
endif()
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
  # A LibTorch of its own (pip's, the official zip), not the system's (Debian's).
  list(GET TORCH_INCLUDE_DIRS 0 _cohort_torch_include)
  set(_cohort_own_torch OFF)
  if(NOT _cohort_torch_include IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    set(_cohort_own_torch ON)
  endif()
  # Note [pip's LibTorch exports libstdc++]: pip's libtorch.so carries parts of a newer
  # GCC's libstdc++, linked in statically, and exports some of them
  # (std::filesystem::remove_all, ...; pytorch/pytorch#133437). Their code calls
  # functions that Debian 12's libstdc++ lacks, weak and so null there: a test's
  # remove_all jumped to address 0. Named before LibTorch on the link line, libstdc++
  # binds every std:: symbol that both define (versioned, @GLIBCXX_...).
  if(_cohort_own_torch AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT APPLE)
    target_link_libraries(cohort_torch INTERFACE stdc++)
  endif()
  target_link_libraries(cohort_torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(cohort_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  # pip's and the official LibTorch are built with the pre-C++11 ABI flag set
  # explicitly; TORCH_CXX_FLAGS carries it.
  separate_arguments(COHORT_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(cohort_torch INTERFACE ${COHORT_TORCH_CXX_FLAGS})
  # Note [LibTorch's own fmt]: pip's LibTorch ships fmt's headers (fmt 12 in 2.11) in
  # its include directory, which comes before the system's, so every `#include
  # <fmt/...>` of cohort's gets those while Debian's libfmt (9 on Debian 12) is the
  # one linked: fmt::v12 symbols go missing. Such a LibTorch gets fmt header-only.
  # Debian's LibTorch uses the system's fmt and has its headers in /usr/include.
  if(_cohort_own_torch AND EXISTS "${_cohort_torch_include}/fmt/format.h")
    target_compile_definitions(cohort_torch INTERFACE FMT_HEADER_ONLY=1)
  endif()
  # Note [C++ standard]: cohort is C++17 (CMakeLists.txt), as LibTorch 1.13 and 2.x's
  # headers are. Newer LibTorch is built as C++20 and its headers will refuse C++17
  # at some version: a probe that includes ATen's Tensor (about 3 s, once per build
  # directory) finds out, and such a LibTorch asks its users for C++20.
  if(NOT DEFINED COHORT_TORCH_CXX_STANDARD)
    set(_cohort_probe_std "")
    set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
    foreach(_cohort_std 17 20)
      try_compile(_cohort_probe_ok ${CMAKE_BINARY_DIR}/CMakeFiles/cohort_cxx${_cohort_std}_probe
        SOURCES ${CMAKE_CURRENT_LIST_DIR}/probes/torch_cxx_standard.cpp
        CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${TORCH_INCLUDE_DIRS}"
        COMPILE_DEFINITIONS ${COHORT_TORCH_CXX_FLAGS}
        CXX_STANDARD ${_cohort_std} CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
        OUTPUT_VARIABLE _cohort_probe_log)
      if(_cohort_probe_ok)
        set(_cohort_probe_std ${_cohort_std})
        break()
      endif()
    endforeach()
    unset(CMAKE_TRY_COMPILE_TARGET_TYPE)
    if(NOT _cohort_probe_std)
      # The build will show why; the probe's output is in CMakeFiles/CMakeError.log.
      message(WARNING "cohort: ATen's headers compiled as neither C++17 nor C++20; trying C++17")
      set(_cohort_probe_std 17)
    endif()
    set(COHORT_TORCH_CXX_STANDARD ${_cohort_probe_std} CACHE STRING
      "The C++ standard LibTorch's headers need (found by a probe; 17 or 20)")
  endif()
  if(COHORT_TORCH_CXX_STANDARD GREATER 17)
    target_compile_features(cohort_torch INTERFACE cxx_std_${COHORT_TORCH_CXX_STANDARD})
  endif()
  # Note [Gloo's headers]: ProcessGroupGloo.hpp includes Gloo's headers, which
  # Debian's LibTorch takes from libgloo-dev but pip's wheels do not ship. Debian
  # 12's Gloo (2022) is older than the one in pip's LibTorch 2.x (2.11's compiles
  # against it too, but ProcessGroupGloo.hpp's inline GlooStore then sees another
  # gloo::rendezvous::Store); Debian 13's (0.0~git20231202) matches closely enough.
  # COHORT_GLOO_INCLUDE_DIR names a directory holding such a gloo/ (scripts/pypi-torch
  # makes one); it comes before /usr/include.
  set(COHORT_GLOO_INCLUDE_DIR "" CACHE PATH
    "A directory with Gloo headers matching LibTorch's Gloo, for a LibTorch that ships none (pip's)")
  if(COHORT_GLOO_INCLUDE_DIR)
    if(NOT EXISTS "${COHORT_GLOO_INCLUDE_DIR}/gloo/rendezvous/store.h")
      message(FATAL_ERROR "cohort: COHORT_GLOO_INCLUDE_DIR=${COHORT_GLOO_INCLUDE_DIR} has no gloo/rendezvous/store.h")
    endif()
    target_include_directories(cohort_torch SYSTEM BEFORE INTERFACE ${COHORT_GLOO_INCLUDE_DIR})
    message(STATUS "cohort: Gloo headers from ${COHORT_GLOO_INCLUDE_DIR}")
  elseif(_cohort_own_torch AND NOT EXISTS "${_cohort_torch_include}/gloo/rendezvous/store.h")
    message(STATUS "cohort: this LibTorch ships no Gloo headers; the system's are used "
      "(Note [Gloo's headers]: COHORT_GLOO_INCLUDE_DIR)")
  endif()
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
message(STATUS "cohort: LibTorch ${Torch_VERSION} (C++${COHORT_TORCH_CXX_STANDARD}), NCCL backend: ${COHORT_HAVE_NCCL}")
