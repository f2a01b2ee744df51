# Backend "tcp": no dependency beyond the C++ library and Linux (batch checksums use xxHash
# where it was found: libxxhash-dev, util/checksum.h).
target_sources(xfer PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tcp_transport.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_paths.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_target.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_wire.cc
  ${CMAKE_CURRENT_LIST_DIR}/tcp_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/serve_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/nics.cc
)
