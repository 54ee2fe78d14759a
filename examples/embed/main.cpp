// Smallest useful embedding: warm one kernel into the cache and, with a GPU, run it.
#include <kiln/kiln.h>
#include <kiln/runtime/device.h>
#include <kiln/runtime/kernel_registry.h>
#include <kiln/runtime/module_cache.h>

#include <cstdio>
#include <string>

int main() {
  using namespace kiln;
  std::printf("kiln %s, %zu kernels registered\n", version(), rt::registered_kernels().size());
  const rt::KernelSpec* fill = rt::find_kernel("fill");
  if (!fill) return 1;
  std::string why;
  int arch = rt::gpu_available(&why) ? rt::device_info(0).arch() : 90;
  auto outcome = rt::warm_kernel(*fill, DTypes{DType::f32}, fill->variants.front(), arch);
  std::printf("fill(f32) for sm_%d: %s\n", arch, outcome == rt::WarmOutcome::compiled ? "compiled" : "cached");
  if (!rt::gpu_available()) std::printf("no GPU: %s\n", why.c_str());
  return 0;
}
