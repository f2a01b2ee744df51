# What the backends share (src/transport/common/): host copies, memfd regions, staging buffers,
# and the CUDA helpers. The helpers are built with the CUDA toolkit (e.g. /usr/local/cuda) when
# it is found: host code only (no nvcc, no kernels); the runtime is linked statically and finds
# the driver (libcuda.so.1) at run time, so the build runs on machines without a GPU or driver.
# Without the toolkit, a stub whose functions say why (and the cuda backend is off).
target_sources(xfer PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/buffer_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/host_copy.cc
  ${CMAKE_CURRENT_LIST_DIR}/memfd_regions.cc
  ${CMAKE_CURRENT_LIST_DIR}/memory_sum.cc
  ${CMAKE_CURRENT_LIST_DIR}/staging.cc
)
option(XFER_WITH_CUDA "Build the cuda transport when the CUDA toolkit is found" ON)
set(XFER_CUDA OFF)
if(XFER_WITH_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)  # found even when nvcc is not on PATH
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart_static)
    set(XFER_CUDA ON)
    target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_memory.cc ${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_ipc.cc
                                ${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_copy.cc)
    target_link_libraries(xfer PUBLIC CUDA::cudart_static)
    target_compile_definitions(xfer PUBLIC XFER_HAVE_CUDA=1)
    message(STATUS "xfer: cuda transport on (CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_LIBRARY_DIR})")
  endif()
endif()
if(NOT XFER_CUDA)
  target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_unavailable.cc)
  message(STATUS "xfer: cuda transport off (CUDA toolkit not found or XFER_WITH_CUDA=OFF; set CUDAToolkit_ROOT)")
endif()
