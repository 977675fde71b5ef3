# One helper registers a GoogleTest program with CTest.
#   cohort_add_test(NAME name SOURCES a.cpp ... [LABELS l ...] [LIBS ...] [PROCESSORS n])
# PROCESSORS: how many of ctest's -j slots each of its tests takes (default 1);
# scripts/run-tests runs the multiproc tier two at a time, so 2 makes a test run
# alone (Note [Two multiproc tests at a time]).
# Tests labelled `multiproc` start real processes through `cohort run`; CI fails
# when none of them ran (see .ci/run).
include(GoogleTest)
set(COHORT_LIST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/CohortListSuites.cmake)

# Note [A unit test per suite]: the unit tier registers one CTest test per GoogleTest
# suite (`ctest -R Suite`, run as --gtest_filter=Suite.*), not one per case. Each
# process loads LibTorch first, about 0.6 s on CI's machine (several seconds under
# ASan), which was most of the tier: 664 cases took 240 s, the same cases as 131
# suites take a third of it. The cases of a suite share a fixture and run in one
# process as they do under a plain `./ddp_tests`; the multiproc tier keeps a test
# per case, each of which starts processes of its own and has its own PROCESSORS.
# The list is made after each build (POST_BUILD, as gtest_discover_tests does); a
# program that was not built is one failing test, so the tier never passes empty.
function(cohort_discover_suites target labels)
  set(listed ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D EXE=$<TARGET_FILE:${target}> -D OUT=${listed}
      -D "LABELS=${labels}" -D TIMEOUT=600 -P ${COHORT_LIST_SUITES_SCRIPT}
    BYPRODUCTS ${listed} VERBATIM)
  file(WRITE ${include_file}
    "if(EXISTS \"${listed}\")\n  include(\"${listed}\")\nelse()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "  set_tests_properties(${target}_NOT_BUILT PROPERTIES LABELS \"${labels}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()

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
  if(T_LABELS STREQUAL "unit")
    cohort_discover_suites(${T_NAME} unit)
  else()
    gtest_discover_tests(${T_NAME}
      PROPERTIES LABELS "${T_LABELS}" TIMEOUT 300 PROCESSORS ${T_PROCESSORS}
      DISCOVERY_TIMEOUT 60)
  endif()
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
