// GradReducer: buckets of gradients all-reduced during the backward (kiln/dist/grad_reducer.h).
#include "kiln/dist/grad_reducer.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

#include "kiln/autograd.h"
#include "kiln/creation.h"
#include "kiln/error.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/device.h"
#include "kiln/shape_ops.h"

namespace kiln::dist {

namespace {

constexpr const char* kWhoReducer = "[dist.GradReducer] ";
// Each gradient's view starts this aligned inside its bucket: the products that write weight
// gradients there pick their fast kernels only for aligned outputs (cuBLASLt's TF32 kernels for
// an 8-byte aligned one took the wide MLP's step from 0.60 to 0.82 ms).
constexpr std::size_t kViewAlignBytes = 256;

// A stretch of a bucket's elements with an all-reduce of its own.
struct Piece {
  std::int64_t begin = 0, count = 0;
  rt::Event done;  // recorded on the communication stream after the piece's all-reduce
};

struct Bucket {
  std::vector<std::size_t> params;
  std::vector<std::int64_t> offsets;  // each parameter's first element in `flat`
  std::vector<Tensor> views;  // each parameter's gradient inside `flat`, in its shape
  Tensor flat;                // the bucket's gradients, each at a 256-byte aligned offset
  Tensor wire;                // `flat` in ReducerOptions::wire_dtype, when set
  std::vector<Piece> pieces;  // in order, covering `flat`
  std::size_t pending = 0;    // parameters whose gradient is not complete yet
  bool started = false;
};

// Pieces of at most `most` elements (0: one), each but the last a multiple of `align`.
std::vector<Piece> cut_pieces(std::int64_t n, std::int64_t most, std::int64_t align, int device) {
  const std::int64_t step = most <= 0 ? n : std::max(align, most / align * align);
  std::vector<Piece> out;
  for (std::int64_t b = 0; b < n || out.empty(); b += step) {
    Piece& p = out.emplace_back();
    p.begin = b;
    p.count = std::min(step, n - b);
    p.done = rt::Event::create(device);
  }
  return out;
}

// Whether g already is the bucket's storage for it (a compiled step's backward wrote it there).
bool is_view(const Tensor& g, const Tensor& view) {
  return g.defined() && g.data_ptr() == view.data_ptr() && g.is_contiguous() && g.shape() == view.shape();
}

}  // namespace

std::vector<std::vector<std::size_t>> reducer_buckets(const std::vector<std::size_t>& bytes,
                                                      const ReducerOptions& options) {
  if (options.bucket_bytes == 0) throw ValueError(std::string(kWhoReducer) + "bucket_bytes must be more than 0");
  std::vector<std::vector<std::size_t>> out;
  std::size_t rest = bytes.size();
  if (options.first_bucket_bytes > 0 && options.first_bucket_bytes < options.bucket_bytes && rest > 0) {
    std::vector<std::size_t> first;
    // A parameter that would take it past bucket_bytes starts the next bucket instead, so one
    // large layer does not hold back the first all-reduce.
    for (std::size_t filled = 0; rest > 0 && filled < options.first_bucket_bytes;) {
      if (!first.empty() && bytes[rest - 1] > options.bucket_bytes - filled) break;
      first.push_back(--rest);
      filled += bytes[rest];
    }
    out.push_back(std::move(first));
  }
  const std::vector<std::size_t> head(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(rest));
  for (std::vector<std::size_t>& b : bucket_params(head, options.bucket_bytes)) out.push_back(std::move(b));
  return out;
}

struct GradReducer::Impl {
  ProcessGroup& group;
  std::vector<Tensor> params;
  ReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<std::size_t> bucket_of;
  rt::Stream comm;
  rt::Event grads_in;  // kiln's stream, after a bucket's gradients were copied in

  Impl(ProcessGroup& g, std::vector<Tensor> p, ReducerOptions o)
      : group(g), params(std::move(p)), options(std::move(o)) {}

  const rt::Stream& compute() const { return rt::default_stream(group.device().index()); }

  void ready(std::size_t i) {
    Bucket& b = buckets[bucket_of[i]];
    if (b.pending == 0)
      throw ValueError(std::string(kWhoReducer) + "parameter " + std::to_string(i) +
                       "'s gradient was completed twice before finish(); call finish() after each backward");
    if (--b.pending == 0) start(b);
  }

  // Gradients into the bucket on kiln's stream (unless the backward wrote them there); the
  // all-reduce on the communication stream.
  void start(Bucket& b) {
    NoGradGuard no_grad;
    for (std::size_t k = 0; k < b.params.size(); ++k) {
      const Tensor& g = params[b.params[k]].grad();
      if (!is_view(g, b.views[k])) b.views[k].copy_(g);
    }
    if (b.wire.defined()) b.wire.copy_(b.flat);
    grads_in.record(compute());
    comm.wait(grads_in);
    const Tensor& sent = b.wire.defined() ? b.wire : b.flat;
    for (Piece& piece : b.pieces) {
      Tensor part = narrow(sent, 0, piece.begin, piece.count);
      group.all_reduce(part, ReduceOp::avg, comm);
      piece.done.record(comm);
    }
    b.started = true;
  }

  // Throws (and resets) unless every bucket's all-reduce started in this backward.
  void check_all_started() {
    std::vector<std::size_t> without;
    for (const Bucket& b : buckets)
      for (std::size_t p : b.params)
        if (!b.started && !params[p].grad().defined()) without.push_back(p);
    std::sort(without.begin(), without.end());
    std::string missing;
    for (std::size_t p : without) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    for (const Bucket& b : buckets)
      if (!b.started) {
        reset();
        throw ValueError(std::string(kWhoReducer) + "finish() before every bucket was reduced: parameter(s) " +
                         (missing.empty() ? std::string("of an incomplete bucket") : missing) +
                         " got no gradient in this backward; every parameter must get one on every rank");
      }
  }

  // The elements of parameter k of b that piece q holds, as [first, end) of the parameter.
  static std::pair<std::int64_t, std::int64_t> overlap(const Bucket& b, std::size_t k, const Piece& q) {
    const std::int64_t at = b.offsets[k], n = b.views[k].numel();
    return {std::max(q.begin, at) - at, std::min(q.begin + q.count, at + n) - at};
  }

  // kiln's stream waits for piece q of b's all-reduce; the averages it holds go into .grad().
  void land(Bucket& b, std::size_t q) {
    NoGradGuard no_grad;
    const Piece& piece = b.pieces[q];
    compute().wait(piece.done);
    if (b.wire.defined())
      narrow(b.flat, 0, piece.begin, piece.count).copy_(narrow(b.wire, 0, piece.begin, piece.count));
    for (std::size_t k = 0; k < b.params.size(); ++k) {
      const auto [first, end] = overlap(b, k, piece);
      if (first >= end) continue;
      Tensor& p = params[b.params[k]];
      Tensor g = p.grad();
      if (is_view(g, b.views[k])) continue;
      if (options.grad_as_bucket_view) {
        if (first == 0) p.set_grad(b.views[k]);  // its later pieces are read through the view
        continue;
      }
      if (!g.is_contiguous()) p.set_grad(g = g.contiguous());
      narrow(g.view({-1}), 0, first, end - first).copy_(narrow(b.views[k].view({-1}), 0, first, end - first));
    }
  }

  void finish() {
    check_all_started();
    for (Bucket& b : buckets)
      for (std::size_t q = 0; q < b.pieces.size(); ++q) land(b, q);
    reset();
  }

  // One part per piece: the spans of opt's parameters (indices into opt.params()) that the piece
  // holds; the optimizer updates them right after the piece lands (step_in_spans).
  void finish(optim::Optimizer& opt) {
    check_all_started();
    std::unordered_map<const void*, std::size_t> in_opt;
    for (std::size_t i = 0; i < opt.params().size(); ++i) in_opt.emplace(opt.params()[i].impl(), i);
    std::vector<std::vector<optim::ParamSpan>> parts;
    std::vector<std::pair<std::size_t, std::size_t>> piece_of;  // (bucket, piece) per part
    for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
      const Bucket& b = buckets[bi];
      for (std::size_t q = 0; q < b.pieces.size(); ++q) {
        std::vector<optim::ParamSpan>& part = parts.emplace_back();
        piece_of.emplace_back(bi, q);
        for (std::size_t k = 0; k < b.params.size(); ++k) {
          const auto [first, end] = overlap(b, k, b.pieces[q]);
          auto it = in_opt.find(params[b.params[k]].impl());
          if (first < end && it != in_opt.end())
            part.push_back({.index = it->second, .begin = first, .count = end - first});
        }
      }
    }
    struct Reset {
      Impl& m;
      ~Reset() { m.reset(); }
    } reset_after{*this};
    opt.step_in_spans(parts, [&](std::size_t k) { land(buckets[piece_of[k].first], piece_of[k].second); });
  }

  void reset() {
    for (Bucket& b : buckets) {
      b.pending = b.params.size();
      b.started = false;
    }
  }
};

GradReducer::GradReducer(ProcessGroup& group, std::vector<Tensor> params, ReducerOptions options)
    : impl_(std::make_unique<Impl>(group, std::move(params), options)) {
  Impl& m = *impl_;
  if (m.params.empty()) throw ValueError(std::string(kWhoReducer) + "no parameters");
  if (options.wire_dtype && *options.wire_dtype != DType::bf16 && *options.wire_dtype != DType::f16)
    throw DTypeError(std::string(kWhoReducer) + "wire_dtype must be bf16 or f16, got " +
                     std::string(dtype_name(*options.wire_dtype)));
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const Tensor& p = m.params[i];
    if (!p.defined() || !p.requires_grad() || !p.is_leaf() || !is_floating(p.dtype()))
      throw ValueError(std::string(kWhoReducer) + "parameter " + std::to_string(i) + " is not a floating leaf requiring grad");
    if (p.device() != group.device())
      throw DeviceError(std::string(kWhoReducer) + "parameter " + std::to_string(i) + " lives on " + p.device().str() +
                        ", the group on " + group.device().str());
  }
  // Buckets never mix dtypes: one flat buffer per bucket.
  std::map<DType, std::vector<std::size_t>> by_dtype;
  for (std::size_t i = 0; i < m.params.size(); ++i) by_dtype[m.params[i].dtype()].push_back(i);
  m.bucket_of.resize(m.params.size());
  NoGradGuard no_grad;
  for (const auto& [dtype, idx] : by_dtype) {
    std::vector<std::size_t> bytes;
    for (std::size_t i : idx) bytes.push_back(m.params[i].numel() * m.params[i].element_size());
    const auto align = static_cast<std::int64_t>(kViewAlignBytes / dtype_size(dtype));
    for (const std::vector<std::size_t>& members : reducer_buckets(bytes, options)) {
      Bucket b;
      std::vector<std::int64_t> offsets;
      std::int64_t n = 0;
      for (std::size_t j : members) {
        offsets.push_back((n + align - 1) / align * align);
        n = offsets.back() + m.params[idx[j]].numel();
      }
      b.flat = zeros({n}, {.dtype = dtype, .device = group.device()});
      if (options.wire_dtype && dtype == DType::f32)
        b.wire = zeros({n}, {.dtype = *options.wire_dtype, .device = group.device()});
      for (std::size_t k = 0; k < members.size(); ++k) {
        const Tensor& p = m.params[idx[members[k]]];
        b.params.push_back(idx[members[k]]);
        b.views.push_back(narrow(b.flat, 0, offsets[k], p.numel()).view(p.shape()));
      }
      b.offsets = std::move(offsets);
      b.pieces = cut_pieces(n, static_cast<std::int64_t>(options.piece_bytes / dtype_size(dtype)), align,
                            group.device().index());
      b.pending = b.params.size();
      for (std::size_t p : b.params) m.bucket_of[p] = m.buckets.size();
      m.buckets.push_back(std::move(b));
    }
  }
  // High priority: the all-reduces' blocks take SMs as they free up, ahead of the backward's.
  m.comm = rt::Stream::create(group.device().index(), /*high_priority=*/true);
  m.grads_in = rt::Event::create(group.device().index());
  for (std::size_t i = 0; i < m.params.size(); ++i)
    m.params[i].add_grad_ready_hook([impl = impl_.get(), i](const Tensor&) { impl->ready(i); });
}

GradReducer::~GradReducer() {
  for (Tensor& p : impl_->params) p.clear_grad_ready_hooks();
}

void GradReducer::finish() { impl_->finish(); }

void GradReducer::finish(optim::Optimizer& opt) { impl_->finish(opt); }

std::vector<std::size_t> GradReducer::pieces() const {
  std::vector<std::size_t> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.pieces.size());
  return out;
}

std::vector<std::vector<std::size_t>> GradReducer::buckets() const {
  std::vector<std::vector<std::size_t>> out;
  for (const Bucket& b : impl_->buckets) out.push_back(b.params);
  return out;
}

}  // namespace kiln::dist
