# Backend "cuda": GPU memory moved by the copy engines. Its CUDA helpers, and the toolkit, are
# src/transport/common's (common.cmake): without the toolkit they say why, and so does this.
target_sources(xfer PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cc)
