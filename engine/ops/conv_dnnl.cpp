// conv2d's f32 passes on the CPU through oneDNN's direct convolutions (the library PyTorch's CPU
// convolutions use), where oneDNN was found at build time: on the MNIST cnn's conv2 they took
// about half the time of im2col + OpenBLAS on a 2-core AVX-512 machine. The tensors stay NCHW;
// oneDNN picks its blocked layouts and the data is reordered on the way in and out.
#if KILN_HAVE_DNNL
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "conv_cpu.h"
#include "core/cpu/parallel.h"
#include "kiln/runtime/log.h"

namespace kiln::conv_detail {

namespace {

using dnnl::memory;
using Dims = memory::dims;

// A pass's primitive and the layouts it wants, made once per shape: making one JIT-compiles it.
struct Primitive {
  dnnl::primitive prim;
  memory::desc a, b, out;  // the primitive's layouts of the two inputs and the output
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct Descs {
  memory::desc src, weights, dst;  // NCHW, (G)OIHW, NCHW as kiln stores them
  memory::desc src_any, weights_any, dst_any;
  Dims strides, dilates, pad_l, pad_r;
};

Descs descs_of(const ConvGeometry& s) {
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  Descs d;
  const Dims src{s.n, s.c, s.h, s.w}, dst{s.n, s.o, s.oh, s.ow};
  const Dims w = s.groups == 1 ? Dims{s.o, s.c, s.kh, s.kw} : Dims{s.groups, s.o / s.groups, s.c / s.groups, s.kh, s.kw};
  d.src = memory::desc(src, f32, tag::nchw);
  d.dst = memory::desc(dst, f32, tag::nchw);
  d.weights = memory::desc(w, f32, s.groups == 1 ? tag::oihw : tag::goihw);
  d.src_any = memory::desc(src, f32, tag::any);
  d.dst_any = memory::desc(dst, f32, tag::any);
  d.weights_any = memory::desc(w, f32, tag::any);
  d.strides = {s.sh, s.sw};
  d.dilates = {s.dh - 1, s.dw - 1};
  d.pad_l = {s.ph, s.pw};
  // The right padding that makes the output exactly (oh, ow).
  d.pad_r = {(s.oh - 1) * s.sh + (s.kh - 1) * s.dh + 1 - s.h - s.ph, (s.ow - 1) * s.sw + (s.kw - 1) * s.dw + 1 - s.w - s.pw};
  return d;
}

Primitive make_primitive(ConvPass pass, const ConvGeometry& s) {
  using namespace dnnl;
  const Descs d = descs_of(s);
  dnnl::engine& eng = cpu_engine();
  const auto direct = algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  const convolution_forward::primitive_desc fwd(eng, prop_kind::forward_training, direct, d.src_any, d.weights_any,
                                                d.dst_any, d.strides, d.dilates, d.pad_l, d.pad_r);
#else
  const convolution_forward::primitive_desc fwd(
      convolution_forward::desc(prop_kind::forward_training, direct, d.src_any, d.weights_any, d.dst_any, d.strides,
                                d.dilates, d.pad_l, d.pad_r),
      eng);
#endif
  if (pass == ConvPass::forward) return {convolution_forward(fwd), fwd.src_desc(), fwd.weights_desc(), fwd.dst_desc()};
  if (pass == ConvPass::grad_input) {
#if DNNL_VERSION_MAJOR >= 3
    const convolution_backward_data::primitive_desc bd(eng, direct, d.src_any, d.weights_any, d.dst_any, d.strides,
                                                       d.dilates, d.pad_l, d.pad_r, fwd);
#else
    const convolution_backward_data::primitive_desc bd(
        convolution_backward_data::desc(direct, d.src_any, d.weights_any, d.dst_any, d.strides, d.dilates, d.pad_l,
                                        d.pad_r),
        eng, fwd);
#endif
    return {convolution_backward_data(bd), bd.diff_dst_desc(), bd.weights_desc(), bd.diff_src_desc()};
  }
#if DNNL_VERSION_MAJOR >= 3
  const convolution_backward_weights::primitive_desc bw(eng, direct, d.src_any, d.weights_any, d.dst_any, d.strides,
                                                        d.dilates, d.pad_l, d.pad_r, fwd);
#else
  const convolution_backward_weights::primitive_desc bw(
      convolution_backward_weights::desc(direct, d.src_any, d.weights_any, d.dst_any, d.strides, d.dilates, d.pad_l,
                                         d.pad_r),
      eng, fwd);
#endif
  return {convolution_backward_weights(bw), bw.src_desc(), bw.diff_dst_desc(), bw.diff_weights_desc()};
}

using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t>;

// Primitives by pass and sizes (bounded: a process meets few conv shapes; past the bound the
// oldest is dropped). Executing one primitive from several threads at once is allowed.
std::shared_ptr<const Primitive> primitive_for(ConvPass pass, const ConvGeometry& s) {
  static std::mutex mu;
  static auto* cache = new std::map<Key, std::shared_ptr<const Primitive>>;  // leaked: used until exit
  static auto* order = new std::vector<Key>;
  constexpr std::size_t kMaxShapes = 128;
  const Key key{static_cast<int>(pass), s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.sh, s.sw, s.ph, s.pw,
                s.dh, s.dw, s.groups};
  {
    std::lock_guard lock(mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  auto made = std::make_shared<const Primitive>(make_primitive(pass, s));
  std::lock_guard lock(mu);
  if (cache->size() >= kMaxShapes) {
    cache->erase(order->front());
    order->erase(order->begin());
  }
  auto [it, fresh] = cache->emplace(key, std::move(made));
  if (fresh) order->push_back(key);
  return it->second;
}

// `user` (kiln's layout over `data`) as the primitive wants it: the same memory when the
// layouts agree, else a reordered copy.
memory as_layout(const memory::desc& user, const memory::desc& want, void* data, dnnl::stream& st) {
  memory m(user, cpu_engine(), data);
  if (want == user) return m;
  memory copy(want, cpu_engine());
  dnnl::reorder(m, copy).execute(st, m, copy);
  return copy;
}

// oneDNN threads through OpenMP, whose idle workers spin after each call and then slow kiln's
// own threads (on 2 cores, im2col, batch norm and pooling took up to 70% longer). So each call
// runs on one thread, and kiln's pool runs pieces of the batch side by side.
void one_thread_per_call() {
  thread_local bool set = false;
  if (set) return;
  set = true;
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) f(1);
}

// One execution of a pass on kiln's NCHW buffers: forward (x, w) -> y, grad_input (gy, w) -> dx,
// grad_weight (x, gy) -> dw.
void execute(ConvPass pass, const ConvGeometry& s, void* a, void* b, void* out) {
  one_thread_per_call();
  const Descs d = descs_of(s);
  const std::shared_ptr<const Primitive> p = primitive_for(pass, s);
  dnnl::stream st(cpu_engine());
  const memory::desc& ua = pass == ConvPass::grad_input ? d.dst : d.src;
  const memory::desc& ub = pass == ConvPass::grad_weight ? d.dst : d.weights;
  const memory::desc& uo = pass == ConvPass::forward ? d.dst : pass == ConvPass::grad_input ? d.src : d.weights;
  memory ma = as_layout(ua, p->a, a, st), mb = as_layout(ub, p->b, b, st);
  memory user_out(uo, cpu_engine(), out);
  memory mo = p->out == uo ? user_out : memory(p->out, cpu_engine());
  if (pass == ConvPass::forward)
    p->prim.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mo}});
  else if (pass == ConvPass::grad_input)
    p->prim.execute(st, {{DNNL_ARG_DIFF_DST, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DIFF_SRC, mo}});
  else
    p->prim.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_DIFF_DST, mb}, {DNNL_ARG_DIFF_WEIGHTS, mo}});
  if (p->out != uo) dnnl::reorder(mo, user_out).execute(st, mo, user_out);
  st.wait();
}

// A weight gradient sums over samples and output positions in one running f32 sum per weight;
// past this many terms it drifts from the reference (9e-4 on a sum of 30720, 4.4e-4 on 4096), so
// the batch is cut into pieces of at most this many, summed afterwards (as the GPU's exact-f32
// convs split k).
constexpr std::int64_t kMaxTerms = 2048;

}  // namespace

bool run_conv_dnnl(ConvPass pass, const ConvGeometry& s, const Tensor& a, const Tensor& b, const Tensor& out) {
  // oneDNN's blocked kernels work in blocks of channels; a narrow conv (the cnn's conv1, one
  // input channel) runs faster on im2col + GEMM.
  if (s.c / s.groups < 8 || s.o / s.groups < 8 || s.n == 0) return false;
  const Descs d = descs_of(s);
  if (d.pad_r[0] < 0 || d.pad_r[1] < 0) return false;
  const std::int64_t L = s.oh * s.ow;
  if (pass == ConvPass::grad_weight && L > kMaxTerms) return false;
  // Pieces of nb samples: one per thread for the forward and input gradient (samples are
  // independent), at most kMaxTerms terms for the weight gradient. Each piece's samples start
  // at a's and b's offsets for its first sample.
  const std::int64_t threads = cpu::num_threads();
  const std::int64_t nb = pass == ConvPass::grad_weight ? kMaxTerms / L : (s.n + threads - 1) / threads;
  const std::int64_t pieces = (s.n + nb - 1) / nb;
  const std::int64_t a_per = pass == ConvPass::grad_input ? s.o * L : s.c * s.h * s.w;
  const std::int64_t b_per = pass == ConvPass::grad_weight ? s.o * L : 0;  // the weights are shared
  const std::int64_t out_per = pass == ConvPass::forward ? s.o * L : pass == ConvPass::grad_input ? s.c * s.h * s.w : 0;
  // The weight gradient's pieces each write their own partial sum, added in order afterwards, so
  // the result does not depend on which thread ran which piece.
  std::vector<float> parts(pass == ConvPass::grad_weight ? static_cast<std::size_t>((pieces - 1) * out.numel()) : 0);
  try {
    cpu::parallel_for(pieces, 1, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) {
        ConvGeometry piece = s;
        const std::int64_t n0 = p * nb;
        piece.n = std::min(nb, s.n - n0);
        float* pa = static_cast<float*>(a.data_ptr()) + n0 * a_per;
        float* pb = static_cast<float*>(b.data_ptr()) + n0 * b_per;
        float* po = static_cast<float*>(out.data_ptr()) + n0 * out_per;
        if (pass == ConvPass::grad_weight && p > 0) po = parts.data() + (p - 1) * out.numel();
        execute(pass, piece, pa, pb, po);
      }
    });
  } catch (const dnnl::error& e) {
    static std::once_flag once;
    std::call_once(once, [&] { rt::log().warn("[conv2d] oneDNN declined a convolution ({}); using im2col + GEMM", e.what()); });
    return false;
  }
  float* __restrict dw = static_cast<float*>(out.data_ptr());
  const std::int64_t weights = out.numel();
  for (std::int64_t p = 1; pass == ConvPass::grad_weight && p < pieces; ++p) {
    const float* __restrict part = parts.data() + (p - 1) * weights;
    for (std::int64_t i = 0; i < weights; ++i) dw[i] += part[i];
  }
  return true;
}

}  // namespace kiln::conv_detail
#endif
