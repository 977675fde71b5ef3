# Sanitizer and fuzzer builds (docs/sanitizers.md, docs/fuzzing.md).
#   COHORT_SANITIZE=ON        AddressSanitizer + UndefinedBehaviorSanitizer on every
#                             target of this project (LibTorch itself stays as it is).
#   COHORT_BUILD_FUZZERS=ON   the libFuzzer targets in fuzz/ (clang only); the cohort
#                             libraries get coverage (-fsanitize=fuzzer-no-link) so the
#                             fuzzers see inside the parsers. Implies COHORT_SANITIZE.
# `make test-asan` and `make fuzz` configure build-asan with both, so one build
# serves the sanitized test suite and the fuzzers.
option(COHORT_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(COHORT_BUILD_FUZZERS "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

if(COHORT_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "cohort: COHORT_BUILD_FUZZERS needs clang (libFuzzer); "
                        "configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  set(COHORT_SANITIZE ON CACHE BOOL "" FORCE)
endif()

if(COHORT_SANITIZE)
  # -fno-sanitize-recover: a UBSan finding aborts the process, so a test (or a
  # worker under `cohort run`) that hits one fails instead of printing and passing.
  set(COHORT_SANITIZER_FLAGS
    -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  # -O1 -g1 (after the build type's own -O and -g, so they win): ASan's usual
  # trade-off, fast enough for the multiprocess tier, with file:line in reports.
  add_compile_options(${COHORT_SANITIZER_FLAGS} -O1 -g1)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "cohort: built with ${COHORT_SANITIZER_FLAGS}")
endif()
