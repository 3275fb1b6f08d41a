# Finds LibTorch 2.x for cpprun's own build and, installed beside cpprunConfig.cmake, for the
# projects that use an installed cpprun. Shared so that both link the same libraries the same way.
#
# cpprun_find_torch(HINT <dir>) : find_package(Torch) preferring <dir> (the Torch_DIR cpprun was
#   built with), then repair how a pip wheel's LibTorch links (see below).

# Note [A pip wheel's CUDA libraries]
# PyTorch's wheel carries its own CUDA runtime, NCCL, cuDNN, ... in site-packages/nvidia/*/lib,
# and libtorch_cuda.so finds them through its RPATH. Its CMake config, though, adds the CUDA
# runtime and NVRTC of whatever toolkit find_package(CUDAToolkit) finds (/usr/local/cuda), and the
# linker resolves libtorch_cuda.so's own needs (libnccl.so.2, ...) along our executable's RPATH,
# i.e. in that toolkit too. A toolkit older than the wheel's then fails the link (the toolkit's
# NCCL lacks ncclSignal) or, worse, loads an older CUDA runtime under the wheel at run time.
# So, where the wheel's libraries are present, we link and resolve against them.
function(_cpprun_use_wheel_cuda_libraries)
  get_filename_component(site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB wheel_lib_dirs LIST_DIRECTORIES true "${site_packages}/nvidia/*/lib")
  if(NOT wheel_lib_dirs OR NOT TARGET torch)
    return()
  endif()
  string(JOIN ":" rpath_link ${wheel_lib_dirs})
  set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${rpath_link}")

  # The runtime and NVRTC our executables need directly: the wheel's, by their versioned names
  # (the wheel ships no unversioned libcudart.so).
  file(GLOB cudart "${site_packages}/nvidia/*/lib/libcudart.so.[0-9]*")
  file(GLOB nvrtc "${site_packages}/nvidia/*/lib/libnvrtc.so.[0-9]*")
  if(cudart AND TARGET CUDA::cudart)
    list(GET cudart 0 cudart)
    set_property(TARGET CUDA::cudart PROPERTY IMPORTED_LOCATION "${cudart}")
  endif()
  if(nvrtc AND CUDA_NVRTC_LIB)
    list(GET nvrtc 0 nvrtc)
    list(TRANSFORM TORCH_LIBRARIES REPLACE "^${CUDA_NVRTC_LIB}$" "${nvrtc}")
    set(TORCH_LIBRARIES "${TORCH_LIBRARIES}" PARENT_SCOPE)
  endif()
endfunction()

macro(cpprun_find_torch)
  cmake_parse_arguments(_cpprun_ft "" "HINT" "" ${ARGN})
  if(_cpprun_ft_HINT AND NOT Torch_DIR)
    set(Torch_DIR "${_cpprun_ft_HINT}" CACHE PATH "LibTorch's CMake config directory")
  endif()
  find_package(Torch QUIET)
  if(Torch_FOUND)
    _cpprun_use_wheel_cuda_libraries()
  endif()
endmacro()
