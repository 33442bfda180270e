# Long-run and packaging checks (docs/hardening.md), run by ctest like the rest:
#   soak     tests/soak.sh: `segtape train` for many steps keeps RSS and the
#            segment high-water flat (from metrics.csv)
#   soak     tests/kill_test.sh (the fault run): SIGKILL, SIGINT and SIGTERM at
#            random moments, during checkpoint writes too, of the default
#            agent (kill_during_checkpoint) and of --task lm (fault_run_lm)
#            never leave an unloadable checkpoint; --resume ends
#            bit-identical to an unbroken run
#   memory   tests/size_check_test.sh (size_check): the size check's estimate,
#            made before anything is allocated, against the measured peak
#            RSS of 13 runs (never below, at most 10 % + 64 MiB above), and
#            runs refused up front for the memory available and ulimit -v
#   package  tests/package/test.sh: cmake --install, then find_package(segtape)
#            from an out-of-tree project
#   package  examples/custom_env/test.sh (custom_env): the same for the env
#            example, trained by its own program and as a plug-in of the
#            installed segtape (--env-plugin, --resume, eval, the errors)
# Not in a sanitizer build: these time the real program (an instrumented one
# is 2-3x slower and its RSS is ASan's shadow memory), and an instrumented
# install cannot be linked by the uninstrumented consumer project.
if(NOT SEGTAPE_SANITIZE)
  set(SEGTAPE_SOAK_STEPS 100000 CACHE STRING "Steps of the ctest soak (tests/soak.sh)")
  set(SEGTAPE_KILLS 50 CACHE STRING "Interruptions of each ctest fault run (tests/kill_test.sh)")
  add_test(NAME soak COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/soak.sh ${SEGTAPE_SOAK_STEPS} $<TARGET_FILE:segtape>)
  add_test(NAME kill_during_checkpoint COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/kill_test.sh ${SEGTAPE_KILLS} $<TARGET_FILE:segtape> agent)
  add_test(NAME fault_run_lm COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/kill_test.sh ${SEGTAPE_KILLS} $<TARGET_FILE:segtape> lm)
  set_tests_properties(soak kill_during_checkpoint fault_run_lm PROPERTIES LABELS soak TIMEOUT 600
                       ENVIRONMENT "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
  # The longest tests (~30 s each, mostly waiting): started first, they overlap the rest.
  set_tests_properties(kill_during_checkpoint fault_run_lm PROPERTIES COST 1000)
  set(SEGTAPE_SIZE_CHECK_MPI "")  # (with MPI: two data-parallel configurations too)
  if(SEGTAPE_HAVE_MPI)
    set(SEGTAPE_SIZE_CHECK_MPI ${MPIEXEC_EXECUTABLE})
  endif()
  add_test(NAME size_check COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/size_check_test.sh $<TARGET_FILE:segtape> ${SEGTAPE_SIZE_CHECK_MPI})
  set_tests_properties(size_check PROPERTIES LABELS memory TIMEOUT 600 ENVIRONMENT "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1" COST 500)
  add_test(NAME package COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/package/test.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(package PROPERTIES LABELS package TIMEOUT 600)
  add_test(NAME custom_env COMMAND bash ${PROJECT_SOURCE_DIR}/examples/custom_env/test.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(custom_env PROPERTIES LABELS package TIMEOUT 600)
endif()
