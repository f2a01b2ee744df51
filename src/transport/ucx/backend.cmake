# Backend "ucx": RDMA on clusters through UCX. Found, in this order:
# - XFER_UCX_ROOT: a UCX install prefix with UCX's CMake package (lib/cmake/ucx), e.g. a
#   cluster's own UCX (HPC-X, MOFED's, a source build) or the libucx-cu13 wheel's libucx/
#   folder (UCX 1.22 with CUDA: scripts/setup.sh puts it in .venv). Its libraries are found
#   at run time through the build's RPATH.
# - pkg-config's ucx (Debian: libucx-dev, UCX 1.13 without CUDA).
# Without UCX the backend is built as a stub that says how to get it; every other backend
# stays (e.g. the GPU machine, which has no UCX).
set(XFER_UCX_ROOT "" CACHE PATH "A UCX install prefix (with lib/cmake/ucx) to build the ucx backend against")
target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_backend.cc)
set(XFER_UCX OFF)
if(XFER_WITH_UCX AND XFER_UCX_ROOT)
  find_package(ucx CONFIG REQUIRED PATHS "${XFER_UCX_ROOT}/lib/cmake/ucx" NO_DEFAULT_PATH)
  set(XFER_UCX ON)
  set(XFER_UCX_VERSION "${ucx_VERSION} from ${XFER_UCX_ROOT}")
  target_link_libraries(xfer PUBLIC ucx::ucp ucx::uct ucx::ucs)
elseif(XFER_WITH_UCX)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    # (Not through CMAKE_PREFIX_PATH: a pip build adds the libucx wheel's prefix to it, whose
    # ucx.pc names the wheel's own build folders. That UCX is taken by XFER_UCX_ROOT.)
    pkg_check_modules(UCX IMPORTED_TARGET NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH ucx)
  endif()
  if(UCX_FOUND)
    set(XFER_UCX ON)
    set(XFER_UCX_VERSION "${UCX_VERSION}")
    target_link_libraries(xfer PUBLIC PkgConfig::UCX)
  endif()
endif()
if(XFER_UCX)
  target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_transport.cc ${CMAKE_CURRENT_LIST_DIR}/ucx_link.cc)
  target_compile_definitions(xfer PUBLIC XFER_HAVE_UCX=1)
  message(STATUS "xfer: ucx transport on (UCX ${XFER_UCX_VERSION})")
else()
  target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_unavailable.cc)
  message(STATUS "xfer: ucx transport off (UCX not found or XFER_WITH_UCX=OFF; Debian: apt-get install libucx-dev, "
                 "or XFER_UCX_ROOT=<a UCX prefix>)")
endif()
