#pragma once
// Measuring a run's cuBLASLt products ahead of it. A cold run measures each product's
// candidates at its first call (tuner.h), 5-40 ms a product on an H200, on the run's critical
// path: 0.15-0.35 s for the trainer's mlp, cnn and speedrun. A shape-only pass notes the
// problems the tuner will measure (tuner.h: take_planned_measurements); prefetch_kernels hands
// a plan's cuBLASLt ones to measure_products_ahead, whose thread measures them on scratch operands once
// the device's context is open, while the run loads its data and waits for its first kernels.
// It stops when the run's thread launches its first product, so no measurement shares the GPU
// with training; the products it did not reach are measured by the run as before.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gemm_lt.h"

namespace kiln::kernels {

// A product as its tune key names it: sizes, layouts, epilogue and dtypes, operands unset.
struct LtProblem {
  LtMatmul g;
  std::array<std::uint32_t, 4> align{256, 256, 256, 256};  // of A, B, D and the bias, in bytes
  bool tf32 = false;                                       // f32 products on TF32 tensor cores
};

// The tune key's problem ("m10 n128 k512 lda512 ldb512 ldd10 At B epilogue bias align 256 256
// 256 256") and dtypes ("f32", "f32/tf32", "bf16->f32") of a product, and back: nullopt for text
// these do not write.
std::string lt_problem_text(const LtMatmul& g, const std::array<std::uint32_t, 4>& align);
std::string lt_dtypes_text(const LtMatmul& g, bool tf32);
std::optional<LtProblem> parse_lt_problem(const std::string& problem, const std::string& dtypes);

// Measures `products` (problem, dtypes) on `device` on a background thread, in order, skipping
// those with a choice already, until run_reaches_products; one such thread at a time (a second
// call while one runs adds nothing). Errors end the thread with a debug log line: measuring
// ahead only saves time.
void measure_products_ahead(std::vector<std::pair<std::string, std::string>> products, int device);
// Whether this thread is the one measuring ahead.
bool measuring_ahead();
// Called by every product and every tuned call that a thread other than that one makes: the
// measuring ahead stops after the product it is on.
void run_reaches_products();
// Waits for the thread to end; returns how many products it measured (tests).
std::size_t wait_for_products_ahead();

}  // namespace kiln::kernels
