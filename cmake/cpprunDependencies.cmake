# Finds LibTorch 2.x (by default the one scripts/setup.sh installs into .venv) and Gloo's headers,
# decides which c10d backends we compile, and says so at configure time.
include(cpprunFindTorch)
cpprun_find_torch()
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "LibTorch was not found.\n"
    "  The simplest: bash scripts/setup.sh, then bash scripts/build.sh (installs PyTorch's wheel\n"
    "  into .venv/ and builds against its LibTorch).\n"
    "  For a LibTorch you already have, give its CMake prefix:\n"
    "    pip/conda install:   -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')\n"
    "    zip from pytorch.org: -DCMAKE_PREFIX_PATH=/path/to/libtorch")
endif()
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR
    "cpprun needs LibTorch 2.x; the one found is ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}).\n"
    "  Support for Debian's LibTorch 1.13 was retired (see docs/development.md, 'Which LibTorch').\n"
    "  Run bash scripts/setup.sh for PyTorch's wheel, or pass -DCMAKE_PREFIX_PATH=<a 2.x LibTorch>.")
endif()
set(CPPRUN_TESTED_TORCH_VERSION 2.15.0)

# c10d's Gloo header includes Gloo's headers, which neither PyTorch's wheel nor its zip ships;
# Debian's libgloo-dev provides them. Only the headers: Gloo's code is inside libtorch_cpu, and
# linking Debian's libgloo as well would give two copies of every Gloo symbol.
find_path(CPPRUN_GLOO_INCLUDE gloo/config.h PATHS ${TORCH_INCLUDE_DIRS})
if(NOT CPPRUN_GLOO_INCLUDE)
  message(FATAL_ERROR
    "Gloo headers (gloo/config.h) were not found; c10d's Gloo backend header needs them.\n"
    "  On Debian 12: sudo apt-get install libgloo-dev   (or run scripts/setup.sh),\n"
    "  or pass -DCPPRUN_GLOO_INCLUDE=<dir containing gloo/>")
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
set(_tested "")
if(NOT Torch_VERSION VERSION_EQUAL CPPRUN_TESTED_TORCH_VERSION)
  set(_tested " (CI builds and tests ${CPPRUN_TESTED_TORCH_VERSION} only)")
endif()
message(STATUS "cpprun: LibTorch ${Torch_VERSION}${_tested} at ${TORCH_INSTALL_PREFIX}")
message(STATUS "cpprun: backends built: ${_backends}")
