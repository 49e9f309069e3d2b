# SPDX-License-Identifier: Apache-2.0
# GPU tests of kernels/ (gshm_copy, gshm_copy_signal, gshm_wait, gshm_broadcast), included by
# tests/gpu/CMakeLists.txt.  Plain C (the GPU machine has no cmocka); each
# exits 77 where it lacks the GPUs it needs.
if(TARGET gshm)
  set(gshm_copy_test_lib gshm)
else()
  set(gshm_copy_test_lib gshm_kernels) # before client/ exists
endif()
foreach(t test_copy test_copy_access test_copy_reset test_signal test_broadcast)
  add_executable(${t} ${CMAKE_CURRENT_LIST_DIR}/${t}.c)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/client/include)
  target_link_libraries(${t} PRIVATE ${gshm_copy_test_lib} gshm_common)
  gshm_warnings(${t})
  add_test(NAME gpu.${t} COMMAND ${t})
  set_tests_properties(gpu.${t} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
# The primary-context retain during another thread's global-mode capture
# (kernels/copy.c gshm__copy_primary_ctx, internal: linked from
# gshm_kernels, not the shared library, which hides it).
add_executable(test_capture_retain ${CMAKE_CURRENT_LIST_DIR}/test_capture_retain.c)
target_link_libraries(test_capture_retain PRIVATE gshm_kernels gshm_common)
gshm_warnings(test_capture_retain)
add_test(NAME gpu.test_capture_retain COMMAND test_capture_retain)
set_tests_properties(gpu.test_capture_retain PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
