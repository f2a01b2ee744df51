# What `cmake --install` puts under a prefix:
# - lib/libxfer.so.<soversion>: the library, with a SONAME (one per minor version while the
#   version is 0.x, whose minor versions may break the ABI); its dependencies (UCX at run time,
#   libsodium, libxxhash, libcurl, the CUDA runtime) are private to it: the public headers use
#   the C++ standard library alone.
# - include/xfer/: the public headers.
# - lib/cmake/xfer/: the CMake package (find_package(xfer) gives the target xfer::xfer), and
#   lib/pkgconfig/xfer.pc.
# - bin/: xfer-info and xfer-bench.
# The build tree holds the package too (xferConfig.cmake in the build folder): the Python
# module links it there (XFER_PREBUILT).
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(XFER_SOVERSION "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
else()
  set(XFER_SOVERSION "${PROJECT_VERSION_MAJOR}")
endif()
set(xfer_SONAME "libxfer.so.${XFER_SOVERSION}")  # (as xferConfig.cmake tells its users)

# The static library's objects again, linked as a shared library with the static one's
# dependencies.
add_library(xfer_shared SHARED $<TARGET_OBJECTS:xfer>)
target_link_libraries(xfer_shared PRIVATE xfer PUBLIC Threads::Threads)
target_compile_features(xfer_shared PUBLIC cxx_std_20)
target_include_directories(xfer_shared PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# The CUDA runtime is linked statically: its symbols stay inside libxfer.so, so that a process
# with a libcudart of its own (torch) keeps using that one.
target_link_options(xfer_shared PRIVATE "LINKER:--exclude-libs,libcudart_static.a")
# It exports xfer's own symbols alone (xfer.map): the header-only libraries compiled into it
# (nlohmann-json, cpp-httplib) stay inside, so a program with its own copies keeps them.
target_link_options(xfer_shared PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/xfer.map")
set_property(TARGET xfer_shared APPEND PROPERTY LINK_DEPENDS "${PROJECT_SOURCE_DIR}/cmake/xfer.map")
if(NOT XFER_SANITIZE AND NOT XFER_FUZZ)  # (clang leaves the sanitizers' runtime to programs)
  target_link_options(xfer_shared PRIVATE "LINKER:--no-undefined")
endif()
set_target_properties(xfer_shared PROPERTIES OUTPUT_NAME xfer EXPORT_NAME xfer VERSION "${PROJECT_VERSION}"
                                             SOVERSION "${XFER_SOVERSION}")
add_library(xfer::xfer ALIAS xfer_shared)

include(CMakePackageConfigHelpers)
set(XFER_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/xfer")
install(TARGETS xfer_shared EXPORT xferTargets LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(DIRECTORY include/xfer DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT xferTargets NAMESPACE xfer:: DESTINATION "${XFER_CMAKE_DIR}")
export(EXPORT xferTargets NAMESPACE xfer:: FILE "${PROJECT_BINARY_DIR}/xferTargets.cmake")
configure_package_config_file(cmake/xferConfig.cmake.in "${PROJECT_BINARY_DIR}/xferConfig.cmake"
                              INSTALL_DESTINATION "${XFER_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/xferConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/xferConfig.cmake" "${PROJECT_BINARY_DIR}/xferConfigVersion.cmake"
        DESTINATION "${XFER_CMAKE_DIR}")
# (Relocatable: the .pc file finds the prefix from where it lies.)
file(RELATIVE_PATH XFER_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" XFER_PC_TO_PREFIX "${XFER_PC_TO_PREFIX}")
configure_file(cmake/xfer.pc.in "${PROJECT_BINARY_DIR}/xfer.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/xfer.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
