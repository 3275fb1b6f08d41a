# libcpprun_agent_store.so: the c10d TCPStore that node 0's agent hosts in a multi-node job. The
# launcher dlopen()s it only when --nnodes > 1, so single-node launches never load LibTorch.
# Included by ../CMakeLists.txt at the end of the top-level directory, once Torch has been found.
add_library(cpprun_agent_store MODULE "${CMAKE_CURRENT_LIST_DIR}/agent_store_plugin.cpp")
target_link_libraries(cpprun_agent_store PRIVATE ${TORCH_LIBRARIES} cpprun_warnings)
target_compile_features(cpprun_agent_store PRIVATE cxx_std_17)
# Next to the cpprun executable in the build tree, where the launcher looks first.
set_target_properties(cpprun_agent_store PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY "$<TARGET_FILE_DIR:cpprun>"
  INSTALL_RPATH_USE_LINK_PATH TRUE)
add_dependencies(cpprun cpprun_agent_store)
get_target_property(_cpprun_agent_store_dir cpprun CPPRUN_AGENT_STORE_INSTALL_DIR)
install(TARGETS cpprun_agent_store LIBRARY DESTINATION "${_cpprun_agent_store_dir}")
