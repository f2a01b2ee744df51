# Backend "local": no dependency beyond the C++ library and Linux.
target_sources(xfer PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/local_backend.cc
)
