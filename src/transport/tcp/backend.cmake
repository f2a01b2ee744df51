# Backend "tcp": no dependency beyond the C++ library and Linux.
target_sources(xfer PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tcp_transport.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_paths.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_target.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_wire.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_backend.cc
)
