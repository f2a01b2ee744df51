# Backend "ucx": RDMA on clusters through UCX. UCX is found at build time for its headers
# only, and loaded at run time (ucx_library.h: dlopen of libucp.so.0, or $XFER_UCX_LIB): nothing
# xfer builds links a UCX library, so one binary runs on machines with or without UCX and uses
# the UCX there. The headers are found, in this order:
# - XFER_UCX_ROOT: a UCX install prefix with UCX's CMake package (lib/cmake/ucx), e.g. a
#   cluster's own UCX (HPC-X, MOFED's, a source build) or the libucx-cu13 wheel's libucx/
#   folder (UCX 1.22 with CUDA: scripts/setup.sh --test puts it in .venv). At run time its
#   lib/libucp.so.0 is tried first, then the dynamic loader's search.
# - pkg-config's ucx (Debian: libucx-dev, UCX 1.13 without CUDA).
# Without UCX's headers the backend is built as a stub that says how to get it; every other
# backend stays (e.g. the GPU machine, which has no UCX).
set(XFER_UCX_ROOT "" CACHE PATH "A UCX install prefix (with lib/cmake/ucx) to build the ucx backend against")
target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_backend.cc)
set(XFER_UCX OFF)
set(XFER_UCX_INCLUDE_DIRS "")  # UCX's headers (the ucx unit tests include them too)
set(XFER_UCX_CFLAGS "")
if(XFER_WITH_UCX AND XFER_UCX_ROOT)
  find_package(ucx CONFIG REQUIRED PATHS "${XFER_UCX_ROOT}/lib/cmake/ucx" NO_DEFAULT_PATH)
  set(XFER_UCX ON)
  set(XFER_UCX_VERSION "${ucx_VERSION} from ${XFER_UCX_ROOT}")
  get_target_property(XFER_UCX_INCLUDE_DIRS ucx::ucp INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT XFER_UCX_INCLUDE_DIRS)
    set(XFER_UCX_INCLUDE_DIRS "${XFER_UCX_ROOT}/include")
  endif()
  set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/ucx_library.cc APPEND PROPERTY COMPILE_DEFINITIONS
               XFER_UCX_ROOT_LIB="${XFER_UCX_ROOT}/lib/libucp.so.0")
elseif(XFER_WITH_UCX)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    # (Not through CMAKE_PREFIX_PATH: a pip build adds the libucx wheel's prefix to it, whose
    # ucx.pc names the wheel's own build folders. That UCX is taken by XFER_UCX_ROOT.)
    pkg_check_modules(UCX NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH ucx)
  endif()
  if(UCX_FOUND)
    set(XFER_UCX ON)
    set(XFER_UCX_VERSION "${UCX_VERSION}")
    set(XFER_UCX_INCLUDE_DIRS ${UCX_INCLUDE_DIRS})
    set(XFER_UCX_CFLAGS ${UCX_CFLAGS_OTHER})
  endif()
endif()
if(XFER_UCX)
  target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_library.cc
                              ${CMAKE_CURRENT_LIST_DIR}/ucx_transport.cc ${CMAKE_CURRENT_LIST_DIR}/ucx_link.cc)
  target_include_directories(xfer PRIVATE ${XFER_UCX_INCLUDE_DIRS})
  target_compile_options(xfer PRIVATE ${XFER_UCX_CFLAGS})
  target_link_libraries(xfer PRIVATE ${CMAKE_DL_LIBS})  # dlopen (in libc itself from glibc 2.34)
  target_compile_definitions(xfer PUBLIC XFER_HAVE_UCX=1)
  message(STATUS "xfer: ucx transport on (the headers of UCX ${XFER_UCX_VERSION}; "
                 "libucp.so.0 loaded at run time)")
else()
  target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ucx_unavailable.cc)
  message(STATUS "xfer: ucx transport off (UCX not found or XFER_WITH_UCX=OFF; Debian: apt-get install libucx-dev, "
                 "or XFER_UCX_ROOT=<a UCX prefix>)")
endif()
