# SPDX-License-Identifier: Apache-2.0
# gshm-demo-gpu (client/demo_gpu.cu): README's device demo.  Process A
# creates a segment on GPU 0 and fills it with a kernel; process B maps it
# on GPU 1 and verifies every element with a kernel over the peer link.
# Included by client/CMakeLists.txt when GSHM_HAVE_CUDA.  The CUDA runtime
# is linked statically; libgshm still loads the driver with dlopen.
add_executable(gshm-demo-gpu ${CMAKE_CURRENT_LIST_DIR}/demo_gpu.cu)
set_target_properties(gshm-demo-gpu PROPERTIES
  CUDA_ARCHITECTURES "${GSHM_CUDA_ARCHS}"
  CUDA_RUNTIME_LIBRARY Static)
target_include_directories(gshm-demo-gpu PRIVATE ${CMAKE_CURRENT_LIST_DIR}/include)
target_link_libraries(gshm-demo-gpu PRIVATE gshm gshm_spawn)
install(TARGETS gshm-demo-gpu RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
