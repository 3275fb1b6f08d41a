# libcpprun_agent_store.so: the c10d TCPStore that node 0's agent hosts in a multi-node job. The
# launcher dlopen()s it only when --nnodes > 1, so single-node launches never load LibTorch.
# Included by ../CMakeLists.txt at the end of the top-level directory, once Torch has been found.
add_library(cpprun_agent_store MODULE "${CMAKE_CURRENT_LIST_DIR}/agent_store_plugin.cpp")
# libtorch_cpu holds c10d's TCPStore. Not ${TORCH_LIBRARIES}: with a CUDA LibTorch that maps
# libtorch_cuda and the CUDA libraries too (2.7 GB with PyTorch 2.15's wheel), and on a loaded
# machine loading them took node 0 past a 3 s join timeout before its store listened.
# What the torch target asks of the code that includes LibTorch (C++20 since 2.15, the C++ ABI
# flag) applies all the same.
target_link_libraries(cpprun_agent_store PRIVATE torch_cpu_library cpprun_warnings)
# cpprun/store_port.h, LibTorch-free, shared with the library.
target_include_directories(cpprun_agent_store PRIVATE "${PROJECT_SOURCE_DIR}/include")
foreach(_property COMPILE_FEATURES COMPILE_OPTIONS)
  get_target_property(_value torch INTERFACE_${_property})
  if(_value)
    set_property(TARGET cpprun_agent_store APPEND PROPERTY ${_property} ${_value})
  endif()
endforeach()
# Next to the cpprun executable in the build tree, where the launcher looks first. Its run path,
# built and installed alike, is the directory of the LibTorch it was built against and nothing
# else: the link path would also bring Torch's stray MKL directories (/lib/intel64, ...) and, when
# installed, lose LibTorch's own, so that an installed cpprun could not load it.
set_target_properties(cpprun_agent_store PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY "$<TARGET_FILE_DIR:cpprun>"
  BUILD_WITH_INSTALL_RPATH TRUE
  INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")
add_dependencies(cpprun cpprun_agent_store)
get_target_property(_cpprun_agent_store_dir cpprun CPPRUN_AGENT_STORE_INSTALL_DIR)
install(TARGETS cpprun_agent_store LIBRARY DESTINATION "${_cpprun_agent_store_dir}")
