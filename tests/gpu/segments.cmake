# SPDX-License-Identifier: Apache-2.0
# GPU tests of device segments (issue 3) and of their restart through the
# fd store (issue 4), included by tests/gpu/CMakeLists.txt.  Plain C (the
# GPU machine has no cmocka) against a real gshmd started by
# tests/harness.c; every role runs in its own process.  Exit 77 (skip)
# without a driver or a GPU; on one GPU only the peer steps are skipped.
if(TARGET gshm_harness)
  set(gshm_segments_harness gshm_harness)
else()
  set(gshm_segments_harness_src ${PROJECT_SOURCE_DIR}/tests/harness.c)
  set(gshm_segments_harness gshm_spawn)
endif()
add_executable(test_segments ${CMAKE_CURRENT_LIST_DIR}/test_segments.c ${gshm_segments_harness_src})
target_include_directories(test_segments PRIVATE ${PROJECT_SOURCE_DIR}/tests
                                                 ${PROJECT_SOURCE_DIR}/client/include)
target_link_libraries(test_segments PRIVATE gshm ${gshm_segments_harness} gshm_common)
gshm_warnings(test_segments)

add_test(NAME gpu.segments COMMAND test_segments)
add_test(NAME gpu.dev_restart COMMAND test_segments restart)
set_tests_properties(gpu.segments gpu.dev_restart PROPERTIES
  LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 150
  ENVIRONMENT "GSHMD=$<TARGET_FILE:gshmd>;GSHMCTL=$<TARGET_FILE:gshmctl>")

# Kill points with device segments (issue 5): one GPU.
add_executable(test_dev_killpoint ${CMAKE_CURRENT_LIST_DIR}/test_dev_killpoint.c ${gshm_segments_harness_src})
target_include_directories(test_dev_killpoint PRIVATE ${PROJECT_SOURCE_DIR}/tests
                                                      ${PROJECT_SOURCE_DIR}/client/include)
target_link_libraries(test_dev_killpoint PRIVATE gshm ${gshm_segments_harness} gshm_common)
gshm_warnings(test_dev_killpoint)
add_test(NAME gpu.dev_killpoint COMMAND test_dev_killpoint)
set_tests_properties(gpu.dev_killpoint PROPERTIES
  LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
  ENVIRONMENT "GSHMD=$<TARGET_FILE:gshmd>;GSHMCTL=$<TARGET_FILE:gshmctl>")
# The same kill points on host segments: checks the test's own logic
# (victims exec'ed, leftovers unlinked, fd baseline) on every CI build.
add_test(NAME killpoint.dev_logic_host COMMAND test_dev_killpoint)
set_tests_properties(killpoint.dev_logic_host PROPERTIES
  LABELS killpoint TIMEOUT 120
  ENVIRONMENT "GSHM_KP_HOST=1;GSHMD=$<TARGET_FILE:gshmd>;GSHMCTL=$<TARGET_FILE:gshmctl>")

# A device segment pulled between two gshmd on one GPU over UCX; a set of
# device segments relayed by a gshmd still pulling it (fan-out).
add_executable(test_cluster_gpu ${CMAKE_CURRENT_LIST_DIR}/test_cluster_gpu.c ${gshm_segments_harness_src})
target_include_directories(test_cluster_gpu PRIVATE ${PROJECT_SOURCE_DIR}/tests
                                                    ${PROJECT_SOURCE_DIR}/client/include)
target_link_libraries(test_cluster_gpu PRIVATE gshm ${gshm_segments_harness} gshm_common pthread)
gshm_warnings(test_cluster_gpu)
add_test(NAME gpu.cluster_pull COMMAND test_cluster_gpu)
set_tests_properties(gpu.cluster_pull PROPERTIES
  LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
  ENVIRONMENT "GSHMD=$<TARGET_FILE:gshmd>;GSHMCTL=$<TARGET_FILE:gshmctl>;UCX_TLS=tcp;UCX_WARN_UNUSED_ENV_VARS=n")

# A device lease holder keeps its leases (access, count, bytes) across a
# gshmd SIGKILL + fd store restart with a chmod in between: one GPU.
add_executable(test_dev_lease ${CMAKE_CURRENT_LIST_DIR}/test_dev_lease.c ${gshm_segments_harness_src})
target_include_directories(test_dev_lease PRIVATE ${PROJECT_SOURCE_DIR}/tests
                                                  ${PROJECT_SOURCE_DIR}/client/include)
target_link_libraries(test_dev_lease PRIVATE gshm ${gshm_segments_harness} gshm_common)
gshm_warnings(test_dev_lease)
add_test(NAME gpu.dev_lease_restart COMMAND test_dev_lease)
set_tests_properties(gpu.dev_lease_restart PROPERTIES
  LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 150
  ENVIRONMENT "GSHMD=$<TARGET_FILE:gshmd>;GSHMCTL=$<TARGET_FILE:gshmctl>")
# The same steps on a host segment: checks the test's own logic on every
# CI build.
add_test(NAME integration.dev_lease_logic_host COMMAND test_dev_lease)
set_tests_properties(integration.dev_lease_logic_host PROPERTIES
  LABELS integration TIMEOUT 120
  ENVIRONMENT "GSHM_DEV_LEASE_HOST=1;GSHMD=$<TARGET_FILE:gshmd>;GSHMCTL=$<TARGET_FILE:gshmctl>")
