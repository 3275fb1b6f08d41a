# cmake --install: headers, library, launcher, and a package config so that
# find_package(cpprun CONFIG REQUIRED) gives the same cpprun::cpprun target as add_subdirectory.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cpprun DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS cpprun_dist EXPORT cpprunTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT cpprunTargets NAMESPACE cpprun:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpprun)

configure_package_config_file(cmake/cpprunConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cpprunConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpprun
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cpprunConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cpprunConfig.cmake ${PROJECT_BINARY_DIR}/cpprunConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/cpprunFindTorch.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cpprun)
