# SPDX-License-Identifier: Apache-2.0
# valgrind memcheck over the integration tests, with gshmd itself under
# valgrind (issue 5): tests/valgrind-gshmd.sh points $GSHMD at itself,
# execs valgrind on the real gshmd, and checks every log for
# "ERROR SUMMARY: 0 errors" and no definite or indirect leak.  Label
# valgrind (ctest -L valgrind); not part of -L integration.
# test_restart is left out: it SIGKILLs gshmd, which leaves no summary.
find_program(GSHM_VALGRIND valgrind)
if(NOT GSHM_VALGRIND)
  message(STATUS "gshm: valgrind not found; no valgrind tests")
  return()
endif()
if(GSHM_SANITIZE)
  message(STATUS "gshm: sanitizer build; no valgrind tests")
  return()
endif()

set(_gshm_vg_script ${CMAKE_CURRENT_LIST_DIR}/valgrind-gshmd.sh)
set(_gshm_vg_logs ${CMAKE_CURRENT_BINARY_DIR}/valgrind-logs)

foreach(t test_session test_badinput test_cli test_killpoint)
  if(TARGET ${t})
    add_test(NAME valgrind_${t}
             COMMAND ${_gshm_vg_script} --test ${_gshm_vg_logs}/${t} $<TARGET_FILE:${t}>)
    set_tests_properties(valgrind_${t} PROPERTIES TIMEOUT 900 LABELS valgrind
                         ENVIRONMENT "${GSHM_TEST_ENV};VALGRIND=${GSHM_VALGRIND}")
  endif()
endforeach()
if(TARGET gshm-demo)
  add_test(NAME valgrind_demo
           COMMAND ${_gshm_vg_script} --test ${_gshm_vg_logs}/demo $<TARGET_FILE:gshm-demo>
                   --no-gpu --size 8M)
  set_tests_properties(valgrind_demo PROPERTIES TIMEOUT 300 LABELS valgrind
                       ENVIRONMENT "${GSHM_TEST_ENV};VALGRIND=${GSHM_VALGRIND}")
endif()
