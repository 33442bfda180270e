# segtape's CMake package (installed by `cmake --install`).
#
#   find_package(segtape 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE segtape::segtape)
#
# Targets: segtape::engine (tensors, tape, segments, ops), segtape::nn
# (modules, optimizers, safetensors checkpoints), segtape::agent (envs,
# policy, trainer), segtape::segtape (all of them) and segtape::plugin (headers
# and C++20 only, for an env plug-in loaded by the segtape program). The libraries are
# static; their link dependencies are found here. segtape_CUDA says whether
# the CUDA backend is built in.

####### Expanded from @PACKAGE_INIT@ by configure_package_config_file() #######
####### Any changes to this file will be overwritten by the next CMake run ####
####### The input file was segtapeConfig.cmake.in                            ########

get_filename_component(PACKAGE_PREFIX_DIR "${CMAKE_CURRENT_LIST_DIR}/../../../" ABSOLUTE)

macro(set_and_check _var _file)
  set(${_var} "${_file}")
  if(NOT EXISTS "${_file}")
    message(FATAL_ERROR "File or directory ${_file} referenced by variable ${_var} does not exist !")
  endif()
endmacro()

macro(check_required_components _NAME)
  foreach(comp ${${_NAME}_FIND_COMPONENTS})
    if(NOT ${_NAME}_${comp}_FOUND)
      if(${_NAME}_FIND_REQUIRED_${comp})
        set(${_NAME}_FOUND FALSE)
      endif()
    endif()
  endforeach()
endmacro()

####################################################################################

include(CMakeFindDependencyMacro)

# nlohmann_json: header-only, used inside segtape::nn and segtape::agent (named
# in their link interface, so its target must exist).
find_dependency(nlohmann_json 3)

# OpenBLAS: the engine's matrix products (CBLAS). Looked up again here rather
# than baked in as a path, so the package survives a move of either.
if(NOT TARGET segtape::openblas)
  find_library(SEGTAPE_OPENBLAS_LIBRARY NAMES openblas HINTS "/usr/lib/x86_64-linux-gnu")
  if(NOT SEGTAPE_OPENBLAS_LIBRARY)
    set(segtape_FOUND FALSE)
    set(segtape_NOT_FOUND_MESSAGE "segtape needs OpenBLAS (libopenblas): apt-get install libopenblas-dev")
    return()
  endif()
  add_library(segtape::openblas INTERFACE IMPORTED)
  set_target_properties(segtape::openblas PROPERTIES INTERFACE_LINK_LIBRARIES "${SEGTAPE_OPENBLAS_LIBRARY}")
endif()

# The CUDA backend, when the package was built with it: the engine's static
# library calls the CUDA runtime, cuBLAS and cuDNN.
set(segtape_CUDA ON)
if(segtape_CUDA)
  find_dependency(CUDAToolkit)
  find_library(SEGTAPE_CUDNN_LIBRARY NAMES cudnn HINTS "/usr/local/cuda/lib" ${CUDAToolkit_LIBRARY_DIR})
  if(NOT SEGTAPE_CUDNN_LIBRARY)
    set(segtape_FOUND FALSE)
    set(segtape_NOT_FOUND_MESSAGE "this segtape was built with its CUDA backend, which needs cuDNN 9 (libcudnn)")
    return()
  endif()
endif()

include("${CMAKE_CURRENT_LIST_DIR}/segtapeTargets.cmake")
if(segtape_CUDA)
  get_target_property(_segtape_engine_links segtape::engine INTERFACE_LINK_LIBRARIES)
  if(NOT "CUDA::cudart" IN_LIST _segtape_engine_links)
    set_property(TARGET segtape::engine APPEND PROPERTY INTERFACE_LINK_LIBRARIES
                 CUDA::cudart CUDA::cublas "${SEGTAPE_CUDNN_LIBRARY}")
  endif()
  unset(_segtape_engine_links)
endif()
set(segtape_VERSION_STRING "0.1.0")
check_required_components(segtape)
