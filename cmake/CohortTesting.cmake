# One helper registers a GoogleTest program with CTest.
#   cohort_add_test(NAME name SOURCES a.cpp ... [LABELS l ...] [LIBS ...] [PROCESSORS n])
# PROCESSORS: how many of ctest's -j slots each of its tests takes (default 1);
# scripts/run-tests runs the multiproc tier two at a time, so 2 makes a test run
# alone (Note [Two multiproc tests at a time]).
# Tests labelled `multiproc` start real processes through `cohort run`; CI fails
# when none of them ran (see .ci/run).
include(GoogleTest)
function(cohort_add_test)
  cmake_parse_arguments(T "" "NAME;PROCESSORS" "SOURCES;LABELS;LIBS" ${ARGN})
  if(NOT T_PROCESSORS)
    set(T_PROCESSORS 1)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE cohort::cohort cohort_test_support GTest::gtest_main ${T_LIBS})
  if(COHORT_USE_PCH)
    target_precompile_headers(${T_NAME} REUSE_FROM cohort_test_pch)
  endif()
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT 300 PROCESSORS ${T_PROCESSORS}
    DISCOVERY_TIMEOUT 60)
endfunction()

# A multiprocess test with its own worker program, which the test starts through
# `cohort run`. The test learns both paths from compile definitions:
#   cohort_add_worker_test(NAME ddp_multiproc_tests SOURCES multiproc/ddp_test.cpp
#     WORKER cohort_ddp_worker WORKER_SOURCES multiproc/ddp/ddp_worker.cpp ...
#     PATH_DEFINE COHORT_DDP_WORKER_PATH [LIBS ...] [PROCESSORS n])
# defines COHORT_CLI_PATH and COHORT_DDP_WORKER_PATH, labelled `multiproc`.
function(cohort_add_worker_test)
  cmake_parse_arguments(W "" "NAME;WORKER;PATH_DEFINE;PROCESSORS" "SOURCES;WORKER_SOURCES;LIBS" ${ARGN})
  add_executable(${W_WORKER} ${W_WORKER_SOURCES})
  target_include_directories(${W_WORKER} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/multiproc)
  target_link_libraries(${W_WORKER} PRIVATE cohort::cohort)
  cohort_add_test(NAME ${W_NAME} SOURCES ${W_SOURCES} LABELS multiproc LIBS ${W_LIBS} PROCESSORS ${W_PROCESSORS})
  add_dependencies(${W_NAME} cohort_cli ${W_WORKER})
  target_compile_definitions(${W_NAME} PRIVATE
    COHORT_CLI_PATH="$<TARGET_FILE:cohort_cli>"
    ${W_PATH_DEFINE}="$<TARGET_FILE:${W_WORKER}>")
endfunction()
