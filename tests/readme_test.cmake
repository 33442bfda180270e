# README.md's first ```cpp block is the program in tests/readme_example.cpp
# between the lines "// README-BEGIN" and "// README-END".
#   readme_example: builds and runs that program (it exits non-zero unless
#                   training divides its loss per step by 100).
#   readme_drift:   fails when the README block and the marked region differ
#                   by a single byte. It runs this same file as a script:
#                   cmake -DREADME=<README.md> -DEXAMPLE=<readme_example.cpp> [-DDIFF_DIR=<dir>] -P tests/readme_test.cmake
if(CMAKE_SCRIPT_MODE_FILE)
  # Text between the end of the line holding `open` and the start of the
  # line holding `close` (the first of each), or a fatal error naming what is missing.
  function(readme_region out file open close)
    file(READ "${file}" text)
    string(FIND "${text}" "${open}" begin)
    if(begin EQUAL -1)
      message(FATAL_ERROR "${file}: no line \"${open}\"")
    endif()
    string(SUBSTRING "${text}" ${begin} -1 text)
    string(FIND "${text}" "\n" eol)
    math(EXPR eol "${eol} + 1")
    string(SUBSTRING "${text}" ${eol} -1 text)
    string(FIND "${text}" "\n${close}" end)
    if(end EQUAL -1)
      message(FATAL_ERROR "${file}: no line \"${close}\" after \"${open}\"")
    endif()
    math(EXPR end "${end} + 1")
    string(SUBSTRING "${text}" 0 ${end} text)
    set(${out} "${text}" PARENT_SCOPE)
  endfunction()
  readme_region(readme_block "${README}" "```cpp" "```")
  readme_region(example_block "${EXAMPLE}" "// README-BEGIN" "// README-END")
  if(NOT readme_block STREQUAL example_block)
    set(see "")
    if(DIFF_DIR)  # both texts written there, to diff
      file(WRITE "${DIFF_DIR}/readme_block.cpp" "${readme_block}")
      file(WRITE "${DIFF_DIR}/example_block.cpp" "${example_block}")
      set(see " See: diff ${DIFF_DIR}/readme_block.cpp ${DIFF_DIR}/example_block.cpp")
    endif()
    message(FATAL_ERROR "README.md's first ```cpp block differs from ${EXAMPLE} between "
                        "// README-BEGIN and // README-END; copy the one you meant onto the other.${see}")
  endif()
  string(LENGTH "${readme_block}" n)
  message(STATUS "README.md's example and ${EXAMPLE} agree (${n} bytes)")
  return()
endif()

add_executable(readme_example ${CMAKE_CURRENT_LIST_DIR}/readme_example.cpp)
target_link_libraries(readme_example PRIVATE segtape_nn segtape_warnings)
add_test(NAME readme_example COMMAND readme_example)
add_test(NAME readme_drift
         COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md
                 -DEXAMPLE=${CMAKE_CURRENT_LIST_DIR}/readme_example.cpp -DDIFF_DIR=${CMAKE_CURRENT_BINARY_DIR}
                 -P ${CMAKE_CURRENT_LIST_FILE})
set_tests_properties(readme_example readme_drift PROPERTIES LABELS nn
                     ENVIRONMENT "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")

# readme_curve: the same program, generated from readme_example.cpp with one
# line added that prints every segment's loss per step (%.9g), for the Python
# package's test that the loop written in Python trains to the same curve
# (python/tests/test_readme_loop.py; tests/run.sh passes it this program).
file(READ ${CMAKE_CURRENT_LIST_DIR}/readme_example.cpp readme_source)
set(readme_anchor "    if (s == 0) first = last;\n")
string(FIND "${readme_source}" "${readme_anchor}" readme_at)
if(readme_at EQUAL -1)
  message(FATAL_ERROR "tests/readme_example.cpp has no line \"if (s == 0) first = last;\" for readme_curve to print after")
endif()
string(REPLACE "${readme_anchor}" "${readme_anchor}    std::printf(\"%.9g\\n\", last);\n" readme_source "${readme_source}")
file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/readme_curve.cpp CONTENT "${readme_source}" @ONLY)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/readme_example.cpp)
add_executable(readme_curve ${CMAKE_CURRENT_BINARY_DIR}/readme_curve.cpp)
target_link_libraries(readme_curve PRIVATE segtape_nn segtape_warnings)
