# Writes OUT: one CTest test per GoogleTest suite of the program EXE, labelled
# LABELS, each bounded by TIMEOUT seconds (Note [A unit test per suite] in
# CohortTesting.cmake). Run after each build of EXE:
#   cmake -D EXE=... -D OUT=... -D LABELS=unit -D TIMEOUT=600 -P CohortListSuites.cmake
execute_process(COMMAND "${EXE}" --gtest_list_tests
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE status TIMEOUT 60)
if(NOT status EQUAL 0)
  file(REMOVE "${OUT}")
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${status}): ${errors}\n"
    "Run it by hand to see why; until it lists its tests, ctest counts it as one failing test.")
endif()
# A suite's line starts in the first column and ends its name with a dot; the cases
# below it are indented, and gtest_main's banner has no dot after its first word.
# GoogleTest runs no DISABLED_ suite or case unless asked, so a suite is registered
# only if at least one of its cases would run: a test of nothing alone passes.
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z_][A-Za-z0-9_/]*)\\.")
    set(suite "${CMAKE_MATCH_1}")
    if(suite MATCHES "(^|/)DISABLED_")
      set(suite "")
    endif()
  elseif(NOT suite STREQUAL "" AND line MATCHES "^  +([A-Za-z0-9_/]+)")
    set(case "${CMAKE_MATCH_1}")
    if(NOT case MATCHES "^DISABLED_")
      list(APPEND suites "${suite}")
      set(suite "")
    endif()
  endif()
endforeach()
set(text "")
set(count 0)
foreach(suite IN LISTS suites)
  string(APPEND text
    "add_test([==[${suite}]==] \"${EXE}\" [==[--gtest_filter=${suite}.*]==])\n"
    "set_tests_properties([==[${suite}]==] PROPERTIES LABELS \"${LABELS}\" TIMEOUT ${TIMEOUT})\n")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  file(REMOVE "${OUT}")
  message(FATAL_ERROR "${EXE} lists no test suite; ctest would count none of its tests.")
endif()
file(WRITE "${OUT}" "${text}")
