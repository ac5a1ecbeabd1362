#pragma once
// The AdamW step over a list of MomentBlocks (moments_8bit.h, moment_layout.h): the optimizer
// update every run takes, with fp32 moments as with 8-bit ones. adamw_step_gpu is the GPU
// optimizer (one CUDA kernel, adamw_step.cu); adamw_step_cpu computes the same bits on the host
// (adamw_step.cpp). Both do the arithmetic of torch.optim.AdamW(fused=True) element by element
// (cpu_adamw.h).
#include <cstdint>

#ifdef GPT2_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "optim/cpu_adamw.h"
#include "optim/moments_8bit.h"

namespace gpt2::optim {

// One AdamW update of the given blocks: at an 8-bit block both moments are dequantized into fp32
// (v from its root), updated by cpu_adamw_update (the same arithmetic as the fp32 path) and
// quantized again with new absmax values; an fp32 block is cpu_adamw_update on its packed moments.
// s.weight_decay applies to blocks whose weight_decay is 1, none to the others. grad, grad_type and
// param_bf16 as for cpu_adamw_update, all indexed by MomentBlock::begin. Runs on the calling
// thread; callers split the block list across threads.
void adamw_step_cpu(const CpuAdamWStep& s, const MomentBlock* blocks, int64_t num_blocks, float* param,
                    const MomentBuffers& moments, const void* grad, HostGradType grad_type, uint16_t* param_bf16);

// The same update on the GPU, everything in device memory: each MomentBlock in one pass by one CUDA
// block (a grid of a few blocks per SM walks the list, the tables in shared memory), the same bits
// as adamw_step_cpu (explicit rounding, no FMA contraction). Whole blocks (kQuantBlock elements,
// begin and, for fp32 moments, state multiples of 8, the buffers they use 16-byte aligned) are read
// and written in 16-byte vectors, every load before the first store; other blocks element by
// element. tables: quant_tables() copied to the device; may be null when no block is quantized
// (fp32 moments only). grad_scale_device (a device scalar, e.g. the clip coefficient) multiplies
// c.grad_scale when given: each gradient value g becomes g * s with s = c.grad_scale *
// *grad_scale_device rounded to fp32 first (with c.grad_scale = 1, g times the coefficient rounded
// once, the bits an in-place clip of an fp32 gradient gave). When found_inf (a device scalar) holds
// nonzero nothing changes.
struct AdamWStepArgs {
  const QuantTables* tables = nullptr;  // null: no 8-bit block in the list
  AdamWCoeffs c;                        // with the weight decay of the decaying blocks
  const MomentBlock* blocks = nullptr;
  int64_t num_blocks = 0;
  float* param = nullptr;
  MomentBuffers moments;
  const void* grad = nullptr;
  HostGradType grad_type = HostGradType::kFloat32;
  uint16_t* param_bf16 = nullptr;
  const float* grad_scale_device = nullptr;
  const float* found_inf = nullptr;
};

#ifdef GPT2_WITH_CUDA
cudaError_t adamw_step_gpu(const AdamWStepArgs& args, cudaStream_t stream);
#endif

}  // namespace gpt2::optim
