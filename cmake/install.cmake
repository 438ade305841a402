# install.cmake: the libraries as libraries. `cmake --install` puts each public library
# (static), the headers of include/edl, a pkg-config file per library and one CMake package
# (`find_package(edl)`, targets edl::core, edl::etcd, ... edl::coll) under the prefix. Each
# .pc file's requirements are read from the target's own link libraries, so the build and the
# installed files cannot disagree. All of it is the component Development: the images install
# only the programs (`cmake --install --component Unspecified`). Included last by the top CMakeLists.txt (every target exists).
include(CMakePackageConfigHelpers)

# The libraries a trainer or a tool may link; the agent, job server and operator libraries are
# parts of their programs, not installed.
set(EDL_PUBLIC_LIBS edlcore edletcd edljob edlstorage edlcoll edlps edldiscovery edldistill edlk8s)
if(TARGET edlcoll_nccl)
  list(APPEND EDL_PUBLIC_LIBS edlcoll_nccl)
endif()

# One link item of a library, as pkg-config says it: appends to the caller's _req (modules)
# or _libs (linker flags).
function(_edl_pc_item item)
  set(req ${_req})
  set(libs ${_libs})
  if(item IN_LIST EDL_PUBLIC_LIBS)
    list(APPEND req ${item})
  elseif(item MATCHES "^PkgConfig::(.+)$")
    list(APPEND req ${${CMAKE_MATCH_1}_MODULE_NAME})
    # ... and the CMake package finds the same module under the same target name
    set_property(GLOBAL APPEND PROPERTY EDL_PKGCONFIG_DEPS
      "pkg_check_modules(${CMAKE_MATCH_1} REQUIRED IMPORTED_TARGET ${${CMAKE_MATCH_1}_MODULE_NAME})")
  elseif(item STREQUAL "CURL::libcurl")
    list(APPEND req libcurl)
  elseif(item STREQUAL "OpenSSL::Crypto")
    list(APPEND req libcrypto)
  elseif(item STREQUAL "Threads::Threads")
    list(APPEND libs -pthread)
  elseif(IS_ABSOLUTE "${item}")
    get_filename_component(dir ${item} DIRECTORY)
    list(APPEND libs ${item} -Wl,-rpath,${dir})
  elseif(item MATCHES "^[A-Za-z0-9_]+$")
    list(APPEND libs -l${item})
  else()
    message(FATAL_ERROR "install.cmake: no pkg-config form for link item '${item}'")
  endif()
  set(_req ${req} PARENT_SCOPE)
  set(_libs ${libs} PARENT_SCOPE)
endfunction()

function(_edl_pc_file lib)
  get_target_property(items ${lib} LINK_LIBRARIES)
  set(_req "")
  set(_libs "")
  foreach(item IN LISTS items)
    if(item)
      _edl_pc_item(${item})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _req)
  list(REMOVE_DUPLICATES _libs)
  string(REPLACE ";" ", " EDL_PC_REQUIRES "${_req}")
  string(REPLACE ";" " " EDL_PC_LIBS "${_libs}")
  get_target_property(defs ${lib} INTERFACE_COMPILE_DEFINITIONS)
  set(EDL_PC_CFLAGS "")
  foreach(d IN LISTS defs)
    if(d)
      string(APPEND EDL_PC_CFLAGS " -D${d}")
    endif()
  endforeach()
  set(EDL_PC_NAME ${lib})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/edl.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${lib}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${lib}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
    COMPONENT Development)
endfunction()

# The .pc files find the prefix from where they lie (${pcfiledir}: LIBDIR/pkgconfig), so an
# installation moved or made with `cmake --install --prefix` still works.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(EDL_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  set(EDL_PC_PREFIX "\${pcfiledir}/..")
  string(REGEX MATCHALL "[^/]+" _parts "${CMAKE_INSTALL_LIBDIR}")
  foreach(_p IN LISTS _parts)
    string(APPEND EDL_PC_PREFIX "/..")
  endforeach()
endif()

foreach(lib IN LISTS EDL_PUBLIC_LIBS)
  string(REGEX REPLACE "^edl" "" short ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
  _edl_pc_file(${lib})
endforeach()

get_property(_deps GLOBAL PROPERTY EDL_PKGCONFIG_DEPS)
list(REMOVE_DUPLICATES _deps)
string(REPLACE ";" "\n" EDL_PKGCONFIG_DEPS "${_deps}")
install(TARGETS ${EDL_PUBLIC_LIBS} EXPORT edlTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/edl DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT Development)
set(EDL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/edl)
install(EXPORT edlTargets NAMESPACE edl:: DESTINATION ${EDL_CMAKE_DIR} COMPONENT Development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/edlConfig.cmake.in
  ${PROJECT_BINARY_DIR}/edlConfig.cmake INSTALL_DESTINATION ${EDL_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/edlConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/edlConfig.cmake ${PROJECT_BINARY_DIR}/edlConfigVersion.cmake
  DESTINATION ${EDL_CMAKE_DIR} COMPONENT Development)
