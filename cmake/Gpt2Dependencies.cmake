# Finds every dependency once, for all folders.
# LibTorch: Torch_DIR or CMAKE_PREFIX_PATH if the user gave one, else the project's .venv (pip torch).

if(NOT Torch_DIR)
  set(_gpt2_py "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  if(NOT EXISTS "${_gpt2_py}")
    find_program(_gpt2_py NAMES python3 python)
  endif()
  if(_gpt2_py)
    execute_process(COMMAND "${_gpt2_py}" -c "import torch; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _gpt2_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _gpt2_rc ERROR_QUIET)
    if(_gpt2_rc EQUAL 0 AND _gpt2_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH "${_gpt2_torch_prefix}")
    endif()
  endif()
endif()

# Torch's CMake config enables CUDA itself when the LibTorch found was built with it; it needs nvcc.
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)   # H100/H200; override with -DCMAKE_CUDA_ARCHITECTURES=...
endif()
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "LibTorch ${Torch_VERSION} from ${Torch_DIR}")
# OpenMP for the one file built with it (src/kernels/int8_gemv_cpu.h says why): LibTorch's own
# libgomp, so the process has one OpenMP runtime and one set of threads. Without it that file runs
# on the calling thread.
find_library(GPT2_TORCH_GOMP NAMES libgomp.so.1 PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
find_package(OpenMP COMPONENTS CXX)

# CUDA code builds when the LibTorch found has CUDA (torch::cuda in TORCH_LIBRARIES).
set(GPT2_WITH_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    find_package(CUDAToolkit REQUIRED)
    set(GPT2_WITH_CUDA ON)
  endif()
endif()

find_package(MPI REQUIRED COMPONENTS C)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(Boost 1.71 REQUIRED COMPONENTS program_options)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)  # header-only; Debian nlohmann-json3-dev
find_package(Threads REQUIRED)
if(GPT2_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# NCCL: pip's nvidia-nccl (NCCL_ROOT on the GPU machine) or the CUDA toolkit's copy.
set(GPT2_WITH_NCCL OFF)
if(GPT2_WITH_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ENV NCCL_ROOT ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ENV NCCL_ROOT ${NCCL_ROOT}
               ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    add_library(gpt2_nccl INTERFACE)
    target_include_directories(gpt2_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(gpt2_nccl INTERFACE ${NCCL_LIBRARY})
    set(GPT2_WITH_NCCL ON)
  endif()
endif()
if(GPT2_WITH_CUDA)
  add_compile_definitions(GPT2_WITH_CUDA=1)   # CUDA paths (streams, pinned memory) compile in
endif()
if(GPT2_WITH_NCCL)
  add_compile_definitions(GPT2_WITH_NCCL=1)
endif()
# ONNX export (src/deploy) when Debian's libonnx-dev is there; without it gpt2-ckpt export-onnx
# says so. (pip LibTorch keeps its protobuf hidden and its ONNX classes in onnx_torch::, so the
# system's libprotobuf and libonnx link beside it.)
set(GPT2_WITH_ONNX OFF)
find_package(Protobuf QUIET)
if(Protobuf_FOUND)
  find_package(ONNX CONFIG QUIET)
  if(ONNX_FOUND)
    set(GPT2_WITH_ONNX ON)
  endif()
endif()
message(STATUS "gpt2-dist: CUDA=${GPT2_WITH_CUDA} NCCL=${GPT2_WITH_NCCL} (${NCCL_LIBRARY}) ONNX=${GPT2_WITH_ONNX}")

# Python with the test references (transformers, tiktoken, h5py) lives in .venv.
set(GPT2_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python with the test references")

# C bindings only: Open MPI's deprecated C++ bindings would otherwise need libmpi_cxx.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
