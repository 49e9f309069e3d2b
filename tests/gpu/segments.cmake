# SPDX-License-Identifier: Apache-2.0
# GPU tests of device segments and of their restart through the fd store,
# included by tests/gpu/CMakeLists.txt.  Plain C (the GPU machine has no
# cmocka) against a real gshmd started by tests/harness.c; every role runs
# in its own process.  Exit 77 (skip) without a driver or a GPU; on one GPU
# only the peer steps are skipped.
if(TARGET gshm_harness)
  set(gshm_segments_harness gshm_harness)
else()
  set(gshm_segments_harness_src ${PROJECT_SOURCE_DIR}/tests/harness.c)
  set(gshm_segments_harness gshm_spawn)
endif()

# gshm_segments_test(<name>): the test program <name> from <name>.c next to
# this file, linked with libgshm and the harness.
function(gshm_segments_test name)
  add_executable(${name} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${name}.c ${gshm_segments_harness_src})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests
                                             ${PROJECT_SOURCE_DIR}/client/include)
  target_link_libraries(${name} PRIVATE gshm ${gshm_segments_harness} gshm_common)
  gshm_warnings(${name})
endfunction()

# gshm_segments_add_test(<test> <label> <timeout s> [ENV <VAR=value>...]
#                        COMMAND <program> [<arg>...]): a ctest of one of
# them with GSHMD and GSHMCTL set (and ENV's variables); a `gpu` test
# skips with exit code 77.
function(gshm_segments_add_test test label timeout)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "" "ENV;COMMAND")
  set(env ${arg_ENV} "GSHMD=$<TARGET_FILE:gshmd>" "GSHMCTL=$<TARGET_FILE:gshmctl>")
  add_test(NAME ${test} COMMAND ${arg_COMMAND})
  set_tests_properties(${test} PROPERTIES LABELS ${label} TIMEOUT ${timeout} ENVIRONMENT "${env}")
  if(label STREQUAL "gpu")
    set_tests_properties(${test} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()

gshm_segments_test(test_segments)
gshm_segments_add_test(gpu.segments gpu 150 COMMAND test_segments)
gshm_segments_add_test(gpu.dev_restart gpu 150 COMMAND test_segments restart)

# Kill points with device segments: one GPU.
gshm_segments_test(test_dev_killpoint)
gshm_segments_add_test(gpu.dev_killpoint gpu 300 COMMAND test_dev_killpoint)
# The same kill points on host segments: checks the test's own logic
# (victims exec'ed, leftovers unlinked, fd baseline) on every CI build.
gshm_segments_add_test(killpoint.dev_logic_host killpoint 120 ENV GSHM_KP_HOST=1
                       COMMAND test_dev_killpoint)

# Device segments across gshmd's switch to daemon.user (root only): made
# before it and after it, and every thread of gshmd (libcuda's too) as that
# user with no capability.  One GPU; the same steps on host segments check
# the test's own logic on every CI build.
gshm_segments_test(test_dev_user)
gshm_segments_add_test(gpu.dev_user gpu 150 COMMAND test_dev_user)
gshm_segments_add_test(integration.dev_user_logic_host integration 120 ENV GSHM_DEV_USER_HOST=1
                       COMMAND test_dev_user)

# A device segment pulled between two gshmd on one GPU over UCX; a set of
# device segments relayed by a gshmd still pulling it (fan-out).
gshm_segments_test(test_cluster_gpu)
target_link_libraries(test_cluster_gpu PRIVATE pthread)
gshm_segments_add_test(gpu.cluster_pull gpu 300 ENV UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
                       COMMAND test_cluster_gpu)

# A pull into device memory: the tail past the requested size reads zeros
# over reused device memory; a local segment that cannot be made while the
# first chunks are asked leaves nothing.  One GPU; the same steps on host
# segments check the test's own logic on every CI build.
gshm_segments_test(test_pull_edges)
target_link_libraries(test_pull_edges PRIVATE pthread)
gshm_segments_add_test(gpu.pull_edges gpu 300 ENV UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
                       COMMAND test_pull_edges)
gshm_segments_add_test(cluster.pull_edges_logic_host cluster 120 ENV GSHM_PULL_EDGES_HOST=1
                       UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n COMMAND test_pull_edges)

# A device lease holder keeps its leases (access, count, bytes) across a
# gshmd SIGKILL + fd store restart with a chmod in between: one GPU.
gshm_segments_test(test_dev_lease)
gshm_segments_add_test(gpu.dev_lease_restart gpu 150 COMMAND test_dev_lease)
# The same steps on a host segment: checks the test's own logic on every
# CI build.
gshm_segments_add_test(integration.dev_lease_logic_host integration 120
                       ENV GSHM_DEV_LEASE_HOST=1 COMMAND test_dev_lease)

# A rogue serving peer (it holds the cluster key) whose UCX rendezvous
# into a pull to cuda:0 does not complete until the pull failed, and then
# writes into the local staging slots late (tests/cluster/
# test_cluster_rogue_ucx.c has the host pull's steps): one GPU.  Built with
# the rogue of tests/cluster (plain C: rogue.c, rogue_ucx.c).
gshm_segments_test(test_cluster_gpu_rogue_ucx)
target_sources(test_cluster_gpu_rogue_ucx PRIVATE
               ${PROJECT_SOURCE_DIR}/tests/cluster/rogue.c
               ${PROJECT_SOURCE_DIR}/tests/cluster/rogue_ucx.c
               ${PROJECT_SOURCE_DIR}/daemon/cluster/stream.c
               ${PROJECT_SOURCE_DIR}/daemon/cluster/lane_io.c
               ${PROJECT_SOURCE_DIR}/daemon/cluster/seal.c
               ${PROJECT_SOURCE_DIR}/daemon/cluster/ghash.c)
target_include_directories(test_cluster_gpu_rogue_ucx PRIVATE ${PROJECT_SOURCE_DIR}/tests/cluster
                                                              ${PROJECT_SOURCE_DIR}/daemon/cluster)
target_link_libraries(test_cluster_gpu_rogue_ucx PRIVATE gshm_cluster_pb gshm_proto gshm_dep_uv
                                                         gshm_dep_sodium gshm_dep_ucx pthread)
gshm_segments_add_test(gpu.cluster_rogue_ucx gpu 300 ENV UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n
                       COMMAND test_cluster_gpu_rogue_ucx)
# The same steps on every CI build, under tests/integration's fake
# libcuda.so.1 (no GPU: the device segments' bytes are not compared):
# the device pull's held slots, the late writes, the release.
if(TARGET fake_libcuda)
  gshm_segments_add_test(cluster.rogue_ucx_fake_cuda cluster 300
                         ENV UCX_TLS=tcp UCX_WARN_UNUSED_ENV_VARS=n GSHM_ROGUE_UCX_FAKE_CUDA=1
                         LD_LIBRARY_PATH=$<TARGET_FILE_DIR:fake_libcuda>
                         COMMAND test_cluster_gpu_rogue_ucx)
  add_dependencies(test_cluster_gpu_rogue_ucx fake_libcuda)
endif()
