# Finds LibTorch (1.13 from Debian, or any 2.x given with -DCMAKE_PREFIX_PATH) and Gloo,
# decides which c10d backends we compile, and says so at configure time.

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "LibTorch was not found.\n"
    "  On Debian 12: sudo scripts/setup.sh   (installs libtorch-dev libgloo-dev)\n"
    "  For another LibTorch (e.g. the one in a PyTorch install):\n"
    "    cmake -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)') ...")
endif()

# torch/version.h tells the version the headers are, whatever cmake calls it.
find_file(CPPRUN_TORCH_VERSION_H torch/version.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(CPPRUN_TORCH_VERSION_H)
  foreach(_part MAJOR MINOR PATCH)
    file(STRINGS "${CPPRUN_TORCH_VERSION_H}" _line REGEX "#define TORCH_VERSION_${_part} ")
    string(REGEX REPLACE ".* ([0-9]+).*" "\\1" _torch_${_part} "${_line}")
  endforeach()
  set(CPPRUN_TORCH_VERSION "${_torch_MAJOR}.${_torch_MINOR}.${_torch_PATCH}")
endif()

# Debian's Gloo is a separate package; a pip LibTorch carries Gloo inside libtorch_cpu.
find_package(Gloo CONFIG QUIET)
find_path(CPPRUN_GLOO_INCLUDE gloo/config.h PATHS ${TORCH_INCLUDE_DIRS} ${GLOO_INCLUDE_DIRS})
if(NOT CPPRUN_GLOO_INCLUDE)
  message(FATAL_ERROR
    "Gloo headers (gloo/config.h) were not found; c10d's Gloo backend needs them.\n"
    "  On Debian 12: sudo apt-get install libgloo-dev   (or run scripts/setup.sh)")
endif()

# CUDA/NCCL code compiles only when this LibTorch was built with CUDA.
set(CPPRUN_WITH_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA)
  find_file(CPPRUN_NCCL_PG_H torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp
            PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(CPPRUN_NCCL_PG_H)
    set(CPPRUN_WITH_NCCL ON)
  endif()
endif()

set(_backends "gloo (CPU)")
if(CPPRUN_WITH_NCCL)
  string(APPEND _backends ", nccl (CUDA)")
endif()
message(STATUS "cpprun: LibTorch ${CPPRUN_TORCH_VERSION} at ${TORCH_INSTALL_PREFIX}")
message(STATUS "cpprun: backends built: ${_backends}")
