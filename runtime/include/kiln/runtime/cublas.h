#pragma once
// One cuBLAS handle per (device, stream), with its workspace set; created on first use.
namespace kiln::rt {
class Stream;
void* cublas_handle(const Stream& s);  // cublasHandle_t
}  // namespace kiln::rt
