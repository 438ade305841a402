# nccl_tests.cmake: test_nccl, the NCCL back end's own test, included by tests/CMakeLists.txt
# (which leaves test_nccl.c out of its test_*.c loop: it needs CUDA and edlcoll_nccl). Added
# only when collective/nccl.cmake built the back end. Without a GPU the test exits 77, which
# ctest reports as skipped.
if(EDL_HAVE_NCCL AND TARGET edlcoll_nccl)
  add_executable(test_nccl ${CMAKE_CURRENT_LIST_DIR}/test_nccl.c
                 ${CMAKE_CURRENT_LIST_DIR}/cmocka_filter.c)
  target_link_libraries(test_nccl PRIVATE edlcoll_nccl PkgConfig::CMOCKA)
  add_test(NAME test_nccl COMMAND test_nccl)
  set_tests_properties(test_nccl PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 240
                       ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT")
endif()
