# nccl.cmake: the optional NCCL back end of libedlcoll, included by collective/CMakeLists.txt.
# Finds the CUDA runtime and NCCL; when both are there, defines the static library
# edlcoll_nccl (collective/nccl.c) and sets EDL_HAVE_NCCL ON, else OFF with the reason.
# -DEDL_NCCL=OFF skips the search. Hints: CUDAToolkit_ROOT / CUDA_HOME for CUDA, NCCL_ROOT /
# NCCL_HOME for NCCL (default: /usr/local/cuda for both).

option(EDL_NCCL "Build the NCCL back end of libedlcoll when CUDA and NCCL are found" ON)
set(EDL_HAVE_NCCL OFF)

function(_edl_nccl_search)
  set(_why "")
  if(NOT EDL_NCCL)
    set(_why "disabled by -DEDL_NCCL=OFF")
  endif()

  # CUDA runtime: where CMake's CUDAToolkit module says, else the usual roots.
  set(_cuda_roots $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda)
  if(NOT _why)
    if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    # Only to learn where the toolkit is: plain paths (not the CUDA::cudart imported target,
    # which is local to this directory) keep edlcoll_nccl linkable from any directory.
    find_package(CUDAToolkit QUIET)
    find_path(EDL_CUDA_INCLUDE_DIR cuda_runtime_api.h
              HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_cuda_roots} PATH_SUFFIXES include)
    find_library(EDL_CUDART_LIBRARY cudart
                 HINTS ${CUDAToolkit_LIBRARY_DIR} ${_cuda_roots} PATH_SUFFIXES lib64 lib lib/x64)
    if(EDL_CUDA_INCLUDE_DIR AND EDL_CUDART_LIBRARY)
      set(_cudart ${EDL_CUDART_LIBRARY})
      set(_cuda_inc ${EDL_CUDA_INCLUDE_DIR})
      get_filename_component(_cuda_libdir ${EDL_CUDART_LIBRARY} DIRECTORY)
    else()
      set(_why "CUDA runtime not found (cuda_runtime_api.h / libcudart; set CUDA_HOME)")
    endif()
  endif()

  # NCCL: often installed next to CUDA, or from the distribution's libnccl-dev.
  if(NOT _why)
    set(_nccl_roots ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${_cuda_roots})
    find_path(EDL_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_roots} PATH_SUFFIXES include)
    find_library(EDL_NCCL_LIBRARY nccl HINTS ${_nccl_roots} PATH_SUFFIXES lib64 lib)
    if(NOT EDL_NCCL_INCLUDE_DIR OR NOT EDL_NCCL_LIBRARY)
      set(_why "NCCL not found (nccl.h / libnccl.so; set NCCL_ROOT)")
    else()
      file(STRINGS ${EDL_NCCL_INCLUDE_DIR}/nccl.h _code REGEX "^#define NCCL_VERSION_CODE ")
      string(REGEX REPLACE "^#define NCCL_VERSION_CODE +([0-9]+).*" "\\1" _code "${_code}")
      # nccl.c needs non-blocking communicators (2.14). Codes are major*10000 + minor*100 +
      # patch from 2.9 on (21400 = 2.14.0); older releases used 4-digit codes.
      if(NOT _code MATCHES "^[0-9]+$" OR _code LESS 21400)
        set(_why "NCCL in ${EDL_NCCL_INCLUDE_DIR} is too old (version code '${_code}', need 2.14)")
      endif()
    endif()
  endif()

  if(_why)
    message(STATUS "NCCL back end: off (${_why})")
    return()
  endif()

  get_filename_component(_nccl_libdir ${EDL_NCCL_LIBRARY} DIRECTORY)
  add_library(edlcoll_nccl STATIC ${CMAKE_CURRENT_LIST_DIR}/nccl.c)
  # NCCL's and CUDA's directories come first (nccl.c checks that <nccl.h> is NCCL's).
  target_include_directories(edlcoll_nccl BEFORE PUBLIC ${EDL_NCCL_INCLUDE_DIR} ${_cuda_inc})
  # (include/edl comes with edlcore; nccl_backend.h is for test_nccl, in the build tree only)
  target_include_directories(edlcoll_nccl PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}>)
  # edlcore: edl_strerror and edl_monotonic_ms (core/ is added before collective/).
  target_link_libraries(edlcoll_nccl PUBLIC edlcore ${EDL_NCCL_LIBRARY} ${_cudart})
  set_target_properties(edlcoll_nccl PROPERTIES POSITION_INDEPENDENT_CODE ON)
  # Binaries that link the static library find libnccl and libcudart where they were found
  # at build time: the RPATH goes with the link interface, to every executable that uses it.
  list(REMOVE_DUPLICATES _cuda_libdir)
  set(_rpath ${_nccl_libdir} ${_cuda_libdir})
  list(REMOVE_DUPLICATES _rpath)
  foreach(_dir ${_rpath})
    target_link_options(edlcoll_nccl INTERFACE "LINKER:-rpath,${_dir}")
  endforeach()
  message(STATUS "NCCL back end: on (NCCL ${_code} at ${EDL_NCCL_LIBRARY}, CUDA runtime ${_cudart})")
  set(EDL_HAVE_NCCL ON PARENT_SCOPE)
endfunction()

_edl_nccl_search()
# Also a cache entry, so that every directory (tests/ decides on test_nccl) sees the answer
# whichever directory included this file. Recomputed at every configure.
set(EDL_HAVE_NCCL ${EDL_HAVE_NCCL} CACHE INTERNAL "the NCCL back end of libedlcoll is built")
