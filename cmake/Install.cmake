# `cmake --install`: headers, the static libraries, a CMake package config with
# a version file (find_package(mhla 0.1 CONFIG REQUIRED), then
# target_link_libraries(app mhla::mhla)) and a pkg-config file (mhla.pc).
# The mhla program and the Python package install from their own folders.
# These rules form the component `library`: `cmake --install BUILD --component
# library` needs only the target `mhla_library` built (scripts/build.sh installs
# it so into build/prefix for the lab in experiments/).
include(CMakePackageConfigHelpers)

set(MHLA_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mhla)
set(MHLA_EXPORTED_TARGETS mhla mhla_support mhla_openblas)
if(MHLA_WITH_MPI)
  list(APPEND MHLA_EXPORTED_TARGETS mhla_context_parallel)
endif()
add_custom_target(mhla_library DEPENDS ${MHLA_EXPORTED_TARGETS})
install(TARGETS ${MHLA_EXPORTED_TARGETS} EXPORT mhlaTargets COMPONENT library
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mhla ${PROJECT_BINARY_DIR}/include/mhla
  ${PROJECT_SOURCE_DIR}/support/mhla_support DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT library FILES_MATCHING PATTERN "*.hpp")
install(EXPORT mhlaTargets NAMESPACE mhla:: DESTINATION ${MHLA_CMAKE_INSTALL_DIR} COMPONENT library)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mhlaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mhlaConfig.cmake INSTALL_DESTINATION ${MHLA_CMAKE_INSTALL_DIR})
# 0.x: a minor version may change the API, so only patch releases are compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mhlaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mhlaConfig.cmake ${PROJECT_BINARY_DIR}/mhlaConfigVersion.cmake
  DESTINATION ${MHLA_CMAKE_INSTALL_DIR} COMPONENT library)

# The .pc file finds the prefix from its own place (${pcfiledir}), so that it
# stays right under any `cmake --install --prefix`.
file(RELATIVE_PATH MHLA_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
# A CUDA build also links the static CUDA runtime and what it needs.
set(MHLA_PC_CUDA_LIBS "")
if(MHLA_WITH_CUDA)
  set(MHLA_PC_CUDA_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt -lpthread")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/mhla.pc.in ${PROJECT_BINARY_DIR}/mhla.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mhla.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT library)
