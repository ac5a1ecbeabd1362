// Reports the NCCL version this binary was built against and the one it runs with.
#include <cuda_runtime.h>
#include <nccl.h>
#include <string>
namespace gpt2::parallel {
std::string nccl_version_string() {
  int v = 0;
  ncclGetVersion(&v);
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}
}  // namespace gpt2::parallel
