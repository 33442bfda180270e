#----------------------------------------------------------------
# Generated CMake target import file for configuration "Release".
#----------------------------------------------------------------

# Commands may need to know the format version.
set(CMAKE_IMPORT_FILE_VERSION 1)

# Import target "segtape::engine" for configuration "Release"
set_property(TARGET segtape::engine APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties(segtape::engine PROPERTIES
  IMPORTED_LINK_INTERFACE_LANGUAGES_RELEASE "CUDA;CXX"
  IMPORTED_LOCATION_RELEASE "${_IMPORT_PREFIX}/lib/libsegtape_engine.a"
  )

list(APPEND _cmake_import_check_targets segtape::engine )
list(APPEND _cmake_import_check_files_for_segtape::engine "${_IMPORT_PREFIX}/lib/libsegtape_engine.a" )

# Import target "segtape::nn" for configuration "Release"
set_property(TARGET segtape::nn APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties(segtape::nn PROPERTIES
  IMPORTED_LINK_INTERFACE_LANGUAGES_RELEASE "CXX"
  IMPORTED_LOCATION_RELEASE "${_IMPORT_PREFIX}/lib/libsegtape_nn.a"
  )

list(APPEND _cmake_import_check_targets segtape::nn )
list(APPEND _cmake_import_check_files_for_segtape::nn "${_IMPORT_PREFIX}/lib/libsegtape_nn.a" )

# Import target "segtape::agent" for configuration "Release"
set_property(TARGET segtape::agent APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties(segtape::agent PROPERTIES
  IMPORTED_LINK_INTERFACE_LANGUAGES_RELEASE "CXX"
  IMPORTED_LOCATION_RELEASE "${_IMPORT_PREFIX}/lib/libsegtape_agent.a"
  )

list(APPEND _cmake_import_check_targets segtape::agent )
list(APPEND _cmake_import_check_files_for_segtape::agent "${_IMPORT_PREFIX}/lib/libsegtape_agent.a" )

# Commands beyond this point should not need to know the version.
set(CMAKE_IMPORT_FILE_VERSION)
