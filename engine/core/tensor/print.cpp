// operator<<: values in PyTorch's layout, then dtype, device and shape.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "copy.h"
#include "core/cpu/loops.h"
#include "kiln/autograd.h"

namespace kiln {

namespace {

constexpr std::int64_t kSummarizeAbove = 1000;  // elements; PyTorch's threshold
constexpr std::int64_t kEdgeItems = 3;

// The indices of one dim that are printed; -1 marks the elided middle.
std::vector<std::int64_t> shown(std::int64_t size, bool summarize) {
  std::vector<std::int64_t> idx;
  if (summarize && size > 2 * kEdgeItems) {
    for (std::int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);
    for (std::int64_t i = size - kEdgeItems; i < size; ++i) idx.push_back(i);
  } else {
    for (std::int64_t i = 0; i < size; ++i) idx.push_back(i);
  }
  return idx;
}

class Printer {
 public:
  Printer(const Tensor& host) : t_(host), strides_(contiguous_strides(host.shape())) {
    summarize_ = host.numel() > kSummarizeAbove;
    std::vector<std::int64_t> leaves;
    if (host.numel() > 0) collect(0, 0, leaves);
    choose_format(leaves);
    for (std::int64_t i : leaves) width_ = std::max(width_, format(i).size());
  }

  void print(std::ostream& os, int indent) const {
    if (t_.numel() == 0) {
      os << "[]";
      return;
    }
    if (t_.dim() == 0) {
      os << format(0);
      return;
    }
    print_dim(os, 0, 0, indent);
  }

 private:
  void collect(int d, std::int64_t base, std::vector<std::int64_t>& out) const {
    if (d == t_.dim()) {
      out.push_back(base);
      return;
    }
    for (std::int64_t k : shown(t_.shape()[d], summarize_))
      if (k >= 0) collect(d + 1, base + k * strides_[d], out);
  }

  void print_dim(std::ostream& os, int d, std::int64_t base, int indent) const {
    const int nd = t_.dim();
    os << '[';
    bool first = true;
    for (std::int64_t k : shown(t_.shape()[d], summarize_)) {
      if (!first) {
        if (d == nd - 1) {
          os << ", ";
        } else {
          os << ',' << std::string(static_cast<std::size_t>(nd - d - 1), '\n')
             << std::string(static_cast<std::size_t>(indent + d + 1), ' ');
        }
      }
      first = false;
      if (k < 0) os << (d == nd - 1 ? " ..." : "...");  // PyTorch pads the elision in a row
      else if (d == nd - 1) os << pad(format(base + k * strides_[d]));
      else print_dim(os, d + 1, base + k * strides_[d], indent);
    }
    os << ']';
  }

  std::string pad(const std::string& s) const { return std::string(width_ - std::min(width_, s.size()), ' ') + s; }

  void choose_format(const std::vector<std::int64_t>& leaves) {
    if (!is_floating(t_.dtype())) return;
    double max_abs = 0, min_abs = INFINITY;
    bool integral = true;
    for (std::int64_t i : leaves) {
      double v = value(i);
      if (!std::isfinite(v)) continue;
      integral = integral && v == std::floor(v);
      max_abs = std::max(max_abs, std::fabs(v));
      if (v != 0) min_abs = std::min(min_abs, std::fabs(v));
    }
    integral_ = integral;
    scientific_ = max_abs > 1e8 || (!integral && (min_abs < 1e-4 || max_abs / min_abs > 1e3));  // PyTorch's rule
  }

  double value(std::int64_t i) const {
    return cpu::visit(t_.dtype(), [&]<class T>() { return static_cast<double>(cpu::load(cpu::ptr<const T>(t_)[i])); });
  }

  std::string format(std::int64_t i) const {
    const DType dt = t_.dtype();
    if (!is_floating(dt)) {
      const std::int64_t v = cpu::visit(dt, [&]<class T>() {
        if constexpr (std::is_integral_v<T>) return static_cast<std::int64_t>(cpu::ptr<const T>(t_)[i]);
        else return std::int64_t{0};
      });
      if (dt == DType::boolean) return v ? "True" : "False";
      return std::to_string(v);
    }
    const double v = value(i);
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[64];
    if (scientific_) std::snprintf(buf, sizeof buf, "%.4e", v);
    else if (integral_) std::snprintf(buf, sizeof buf, "%.0f.", v);
    else std::snprintf(buf, sizeof buf, "%.4f", v);
    return buf;
  }

  const Tensor& t_;
  Shape strides_;
  bool summarize_ = false, integral_ = false, scientific_ = false;
  std::size_t width_ = 0;
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  Tensor host = host_contiguous(t.detach());
  os << "tensor(";
  Printer(host).print(os, 7);
  os << ", dtype=" << dtype_name(t.dtype()) << ", device=" << t.device() << ", shape=" << shape_str(t.shape());
  if (t.grad_fn()) os << ", grad_fn=" << t.grad_fn()->name();
  else if (t.requires_grad()) os << ", requires_grad=true";
  return os << ')';
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace kiln
