# One helper registers a GoogleTest program with CTest.
#   cohort_add_test(NAME name SOURCES a.cpp ... [LABELS l ...] [LIBS ...])
# Tests labelled `multiproc` start real processes through `cohort run`; CI fails
# when none of them ran (see .ci/run).
include(GoogleTest)
function(cohort_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE cohort::cohort cohort_test_support GTest::gtest_main ${T_LIBS})
  if(COHORT_USE_PCH)
    target_precompile_headers(${T_NAME} REUSE_FROM cohort_test_pch)
  endif()
  gtest_discover_tests(${T_NAME}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT 300
    DISCOVERY_TIMEOUT 60)
endfunction()
