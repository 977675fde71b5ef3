# The exported package: after `cmake --install`, a user's project does
#   find_package(cohort REQUIRED)
#   target_link_libraries(app PRIVATE cohort::cohort)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS cohort cohort_torch EXPORT cohortTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS cohort_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/cohort
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h"
  PATTERN "*_internal.h" EXCLUDE
  PATTERN "launcher" EXCLUDE)
install(EXPORT cohortTargets NAMESPACE cohort::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/cohortConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cohortConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cohortConfig.cmake
  ${PROJECT_BINARY_DIR}/cohortConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/cohort)
