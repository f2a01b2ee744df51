# Backend "cma": no dependency beyond the C++ library and Linux.
target_sources(xfer PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cma_transport.cc
  ${CMAKE_CURRENT_LIST_DIR}/cma_backend.cc
)
