// CPU AdamW (optimizer offload) throughput: one update of N fp32 master weights + moments, split over
// a HostThreadPool, with fp32 gradients, with bf16 gradients plus the bf16 param copy written, and
// the latter with 8-bit moments (memory.optimizer_moments = 8bit: blocks split over the pool).
//   cpu_adamw_bench [elements=100000000] [threads list, e.g. 1,2,4 or 1 2 4; default 1 and all cores]
// One line per thread count and gradient type:
//   cpu_adamw: N elements, T threads, X ms/update, Y M updates/s, Z M updates/s per thread, <grads>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "optim/adamw_step.h"
#include "optim/cpu_adamw.h"
#include "optim/moments_8bit.h"

using gpt2::optim::CpuAdamWStep;
using gpt2::optim::HostGradType;
using gpt2::optim::HostThreadPool;

namespace {

// Deterministic values in [-1, 1) without a generator per thread.
float hash_unit(uint64_t i) {
  i ^= i >> 33;
  i *= 0xff51afd7ed558ccdULL;
  i ^= i >> 33;
  i *= 0xc4ceb9fe1a85ec53ULL;
  i ^= i >> 33;
  return static_cast<float>(static_cast<double>(i >> 40) / static_cast<double>(1ULL << 23) - 1.0);
}

uint16_t to_bf16_trunc(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

std::vector<int> parse_threads(int argc, char** argv) {
  std::vector<int> out;
  for (int a = 2; a < argc; ++a) {
    std::stringstream ss(argv[a]);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.push_back(std::atoi(item.c_str()));
    }
  }
  if (out.empty()) {
    out.push_back(1);
    const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (all > 1) out.push_back(all);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 100000000;
  if (n <= 0) {
    std::fprintf(stderr, "usage: %s [elements] [threads,...]\n", argv[0]);
    return 2;
  }
  const std::vector<int> thread_counts = parse_threads(argc, argv);
  constexpr int64_t kAlign = 64;  // elements: whole cache lines of fp32 and bf16 per thread

  std::vector<float> param(n), exp_avg(n), exp_avg_sq(n), grad(n);
  std::vector<uint16_t> grad_bf16(n), param_bf16(n);
  {
    // First touch from the threads that will use the memory.
    HostThreadPool init(thread_counts.empty() ? 1 : *std::max_element(thread_counts.begin(), thread_counts.end()));
    init.parallel_for(n, kAlign, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        param[i] = hash_unit(4 * i);
        exp_avg[i] = 0.01f * hash_unit(4 * i + 1);
        const float s = 0.01f * hash_unit(4 * i + 2);
        exp_avg_sq[i] = s * s;
        grad[i] = hash_unit(4 * i + 3);
        grad_bf16[i] = to_bf16_trunc(grad[i]);
        param_bf16[i] = 0;
      }
    });
  }
  // 8-bit moments: the same starting moments, quantized.
  const auto blocks = gpt2::optim::contiguous_blocks(n, /*weight_decay=*/true);
  const auto num_blocks = static_cast<int64_t>(blocks.size());
  std::vector<uint8_t> m_codes(n), v_codes(n);
  std::vector<float> m_absmax(num_blocks), v_absmax(num_blocks);
  gpt2::optim::quantize_blocks(gpt2::optim::quant_table(true), exp_avg.data(), n, m_codes.data(), m_absmax.data());
  gpt2::optim::quantize_blocks(gpt2::optim::quant_table(false), exp_avg_sq.data(), n, v_codes.data(), v_absmax.data());
  gpt2::optim::MomentBuffers moments8;
  moments8.exp_avg_codes = m_codes.data();
  moments8.exp_avg_sq_codes = v_codes.data();
  moments8.exp_avg_absmax = m_absmax.data();
  moments8.exp_avg_sq_absmax = v_absmax.data();
  std::printf("# cpu_adamw_bench: isa %s, %u hardware threads\n", gpt2::optim::cpu_adamw_isa(),
              std::thread::hardware_concurrency());

  int64_t step = 0;
  for (const int threads : thread_counts) {
    HostThreadPool pool(threads);
    for (const int mode : {0, 1, 2}) {  // fp32 grads; bf16 grads + bf16 params; the same with 8-bit moments
      const bool bf16 = mode >= 1;
      const auto update = [&] {
        CpuAdamWStep s;
        s.lr = 1e-4;
        s.weight_decay = 0.1;
        s.step = ++step;
        s.grad_scale = 0.5;
        if (mode == 2) {
          pool.parallel_for(num_blocks, 1, [&](int64_t b, int64_t e) {
            gpt2::optim::adamw_step_cpu(s, blocks.data() + b, e - b, param.data(), moments8, grad_bf16.data(),
                                        HostGradType::kBFloat16, param_bf16.data());
          });
          return;
        }
        pool.parallel_for(n, kAlign, [&](int64_t b, int64_t e) {
          if (bf16) {
            gpt2::optim::cpu_adamw_update(s, e - b, param.data() + b, exp_avg.data() + b, exp_avg_sq.data() + b,
                                          grad_bf16.data() + b, HostGradType::kBFloat16, param_bf16.data() + b);
          } else {
            gpt2::optim::cpu_adamw_update(s, e - b, param.data() + b, exp_avg.data() + b, exp_avg_sq.data() + b,
                                          grad.data() + b, HostGradType::kFloat32, nullptr);
          }
        });
      };
      update();  // warm-up
      using Clock = std::chrono::steady_clock;
      const auto start = Clock::now();
      int reps = 0;
      double elapsed = 0;
      do {
        update();
        ++reps;
        elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      } while (reps < 3 || elapsed < 1.0);
      const double ms = 1e3 * elapsed / reps;
      const double mups = static_cast<double>(n) / (ms * 1e3);
      std::printf(
          "cpu_adamw: %lld elements, %d threads, %.2f ms/update, %.1f M updates/s, %.1f M updates/s per thread, %s\n",
          static_cast<long long>(n), pool.num_threads(), ms, mups, mups / pool.num_threads(),
          mode == 2 ? "bf16 grads + bf16 params out, 8-bit moments"
          : bf16    ? "bf16 grads + bf16 params out"
                    : "fp32 grads");
      std::fflush(stdout);
    }
  }
  return 0;
}
