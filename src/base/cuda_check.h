#pragma once
// CUDA_CHECK(call), CUBLASLT_CHECK(call) and NCCL_CHECK(call): throw gpt2::Error naming the call and
// the library's error string. Only for translation units built with CUDA/NCCL (GPT2_WITH_CUDA /
// GPT2_WITH_NCCL).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "src/base/errors.h"

#define CUDA_CHECK(call)                                                                      \
  do {                                                                                        \
    cudaError_t gpt2_cuda_rc_ = (call);                                                       \
    if (gpt2_cuda_rc_ != cudaSuccess)                                                         \
      ::gpt2::throw_call_error(#call, cudaGetErrorString(gpt2_cuda_rc_), __FILE__, __LINE__); \
  } while (0)

#define CUBLASLT_CHECK(call)                                                                     \
  do {                                                                                           \
    cublasStatus_t gpt2_lt_rc_ = (call);                                                         \
    if (gpt2_lt_rc_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::gpt2::throw_call_error(#call, cublasLtGetStatusString(gpt2_lt_rc_), __FILE__, __LINE__); \
  } while (0)

#ifdef GPT2_WITH_NCCL
#include <nccl.h>
#define NCCL_CHECK(call)                                                                                          \
  do {                                                                                                            \
    ncclResult_t gpt2_nccl_rc_ = (call);                                                                          \
    if (gpt2_nccl_rc_ != ncclSuccess && gpt2_nccl_rc_ != ncclInProgress)                                          \
      ::gpt2::throw_call_error(#call,                                                                             \
                               std::string(ncclGetErrorString(gpt2_nccl_rc_)) + ": " + ncclGetLastError(nullptr), \
                               __FILE__, __LINE__);                                                               \
  } while (0)
#endif
