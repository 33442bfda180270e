# Data parallelism (docs/distributed.md), label `dist`: only in a build with
# MPI. Two ranks on this machine (--oversubscribe: CI has 2 cores; the
# OMPI_ALLOW_RUN_AS_ROOT pair lets mpirun start as root, as CI's container is).
#   dist_test       tests/dist_test.cpp under `mpirun -np 2`: the averaged
#                   gradients, 50 segments of 2 ranks against one process with
#                   both ranks' streams, configuration and replica checks,
#                   agreed stops, resume
#   dist_cli        tests/dist_cli_test.sh: `mpirun -np 2 segtape train`
#                   against one process, resume and its rank count, a killed
#                   rank, a hung rank, a mismatched configuration
#   dist_two_hosts  tests/dist_two_hosts.sh: two "hosts" in network
#                   namespaces, Open MPI over TCP between them (skipped,
#                   saying why, where namespaces cannot be made)
if(SEGTAPE_HAVE_MPI)
  set(SEGTAPE_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
  add_executable(dist_test dist_test.cpp)
  target_link_libraries(dist_test PRIVATE segtape_agent GTest::gtest GTest::gtest_main segtape_warnings)
  add_test(NAME dist_test COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe $<TARGET_FILE:dist_test>)
  add_test(NAME dist_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dist_cli_test.sh $<TARGET_FILE:segtape> ${MPIEXEC_EXECUTABLE})
  add_test(NAME dist_two_hosts COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dist_two_hosts.sh $<TARGET_FILE:segtape> ${MPIEXEC_EXECUTABLE})
  # Under the sanitizers (tests/run.sh --sanitize): ASan's checks and UBSan
  # stay on, LeakSanitizer is off for these three. Open MPI's own allocations
  # (strdup and malloc in its plug-ins, unloaded at MPI_Finalize) are reported
  # as leaks, about 121 KB in 3,350 allocations per rank of dist_test, with no
  # frame of segtape's in any of their stacks (checked by hand with
  # detect_leaks=1); the plug-ins' frames show as "<unknown module>", which a
  # suppression by library name cannot match.
  if(SEGTAPE_SANITIZE)
    set(SEGTAPE_MPI_ENV "${SEGTAPE_MPI_ENV};ASAN_OPTIONS=detect_leaks=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1")
  endif()
  set_tests_properties(dist_test dist_cli dist_two_hosts PROPERTIES LABELS dist TIMEOUT 300 ENVIRONMENT "${SEGTAPE_MPI_ENV}")
  # (no namespaces without root: skipped, saying why)
  set_tests_properties(dist_two_hosts PROPERTIES SKIP_RETURN_CODE 77)
endif()
