// The sync_batch_norm op (sync_batch_norm_op.h). Forward: each rank's per-channel count, mean
// and variance are all-gathered and merged with Chan's formula (no cancellation of large means),
// then applied by batch_norm in eval mode with the merged statistics. Backward, as PyTorch's
// SyncBatchNorm: the per-channel sums of dy and dy * xhat are all-reduced, so dx is the gradient
// of the sum of every rank's loss; dweight and dbias stay this rank's (DDP averages them).
#include "core/dtype_sets.h"
#include "sync_batch_norm_op.h"

#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kiln/dist.h"
#include "kiln/elementwise.h"
#include "kiln/nn_functional.h"
#include "kiln/shape_ops.h"
#include "ops/norm_batch_parts.h"
#include "core/registry.h"

namespace kiln::dist::detail {

namespace {

class GroupCollectives : public Collectives {
 public:
  explicit GroupCollectives(ProcessGroup& g) : group_(g) {}
  int world_size() const override { return group_.world_size(); }
  Device device() const override { return group_.device(); }
  void all_gather(const Tensor& in, Tensor& out) override { group_.all_gather(in, out); }
  void all_reduce_sum(Tensor& t) override { group_.all_reduce(t, ReduceOp::sum); }

 private:
  ProcessGroup& group_;
};

struct Handles {
  std::mutex mu;
  std::unordered_map<std::int64_t, std::shared_ptr<Collectives>> live;
  std::int64_t next = 1;
};
Handles& handles() {
  static Handles h;
  return h;
}


// Attrs: relu, momentum, eps, has_weight, has_bias, has_running_mean, has_running_var, group.
struct Params {
  bool relu, weight, bias, rm, rv;
  double momentum, eps;
  std::int64_t group;
};
Params params_of(const Attrs& a) {
  return {a.get_or<bool>("relu", false),           a.get_or<bool>("has_weight", true),
          a.get_or<bool>("has_bias", true),        a.get_or<bool>("has_running_mean", true),
          a.get_or<bool>("has_running_var", true), a.get_or<double>("momentum", 0.1),
          a.get_or<double>("eps", 1e-5),           a.get_or<std::int64_t>("group", 0)};
}

std::int64_t per_channel(const Tensor& x) { return x.shape()[1] == 0 ? 0 : x.numel() / x.shape()[1]; }

// The group of a call, or nullptr for this process alone (no handle, or a world of 1).
std::shared_ptr<Collectives> group_of(const Params& p, const char* op) {
  if (p.group == 0) return nullptr;
  std::shared_ptr<Collectives> c = find_collectives(p.group, op);
  return c->world_size() > 1 ? c : nullptr;
}

struct Moments {
  Tensor mean, var, count;  // (C) each, in the compute dtype; var biased
};

// Chan's merge of the ranks' (count, mean, biased variance), gathered as (world, 3, C).
Moments merge(const Tensor& all) {
  const std::int64_t c = all.shape()[2];
  const Tensor n = narrow(all, 1, 0, 1), m = narrow(all, 1, 1, 1), v = narrow(all, 1, 2, 1);  // (world, 1, C)
  const Tensor count = sum(n, {0});                                                           // (1, C)
  const Tensor mean = sum(n * m, {0}) / count;
  const Tensor m2 = sum(n * v + n * square(m - mean), {0});
  return {reshape(mean, {c}), reshape(m2 / count, {c}), reshape(count, {c})};
}

// running = (1 - momentum) * running + momentum * batch, in the running statistic's dtype.
void update_running(const Tensor& running, const Tensor& batch, double momentum) {
  Tensor(running).copy_(running.to(batch.dtype()) * (1.0 - momentum) + batch * momentum);
}

void forward(const OpArgs& a, std::span<Tensor> out) {
  NoGradGuard no_grad;
  const Params p = params_of(a.attrs);
  const Tensor& x = a.inputs[0];
  const std::shared_ptr<Collectives> group = group_of(p, "sync_batch_norm");
  const Shape c{x.shape()[1]};
  const TensorOptions acc{.dtype = out[1].dtype(), .device = a.device};
  Tensor mean_r, var_r;
  if (per_channel(x) > 0) {
    // eps 0: invstd is 1 / sqrt(var) (correctly rounded), so var comes back to within an ulp or two.
    Tensor invstd_r;
    std::tie(mean_r, invstd_r) = batch_norm_parts::stats(x, 0.0);
    var_r = square(div(1.0, invstd_r));
  } else {  // a rank without rows adds count 0: its mean and variance weigh nothing
    mean_r = zeros(c, acc);
    var_r = zeros(c, acc);
  }
  const Tensor n_r = full(c, static_cast<double>(per_channel(x)), acc);
  Moments s{mean_r, var_r, n_r};
  if (group) {
    Tensor all = empty({group->world_size(), 3, c[0]}, acc);
    group->all_gather(stack({n_r, mean_r, var_r}), all);
    s = merge(all);
  }
  if (p.rm) update_running(a.inputs[3], s.mean, p.momentum);
  if (p.rv) update_running(a.inputs[4], s.var * s.count / (s.count - 1.0), p.momentum);
  // The normalisation is batch_norm's eval mode with the merged statistics as its running ones.
  const Tensor in[] = {x, a.inputs[1], a.inputs[2], s.mean, s.var, x};  // no batch counter
  const Attrs eval{{"training", false},  {"relu", p.relu},           {"eps", p.eps},           {"has_weight", p.weight},
                   {"has_bias", p.bias}, {"has_running_mean", true}, {"has_running_var", true}};
  static const OpDef& batch_norm_op = get_op("batch_norm");
  std::vector<Tensor> r = dispatch(batch_norm_op, in, eval, out.subspan(0, 3));
  for (std::size_t i = 0; i < 3; ++i) out[i] = r[i];
  out[3] = s.count;
}

std::vector<Tensor> backward(const VjpContext& c, std::span<const Tensor> g) {
  const Params p = params_of(c.attrs());
  const Tensor x = c.saved_input(0), y = p.relu ? c.saved_output(0) : Tensor();
  const Tensor mean = c.saved_output(1), invstd = c.saved_output(2), count = c.saved_output(3);
  const Tensor sums = batch_norm_parts::backward_reduce(g[0], x, y, mean, invstd, p.relu);  // (2, C): dbias, dweight
  Tensor dx;
  if (c.needs_grad(0)) {
    Tensor total = sums;
    if (const std::shared_ptr<Collectives> group = group_of(p, "sync_batch_norm")) {
      total = sums.clone();
      group->all_reduce_sum(total);
    }
    dx = batch_norm_parts::backward_elemt(g[0], x, y, p.weight ? c.saved_input(1) : Tensor(), mean, invstd,
                                          total / count, p.relu);
  }
  const std::int64_t channels = mean.shape()[0];
  auto row = [&](std::int64_t i) { return reshape(narrow(sums, 0, i, 1), {channels}); };
  return {dx, p.weight && c.needs_grad(1) ? row(1) : Tensor(), p.bias && c.needs_grad(2) ? row(0) : Tensor(), Tensor(),
          Tensor()};
}

DTypePlan dtypes(const OpArgs& a) {
  // Inputs keep their dtypes (the stages cast what they need); statistics in the compute dtype.
  const DType t = a.inputs[0].dtype(), acc = t == DType::f64 ? DType::f64 : DType::f32;
  DTypePlan plan;
  for (const Tensor& in : a.inputs) plan.inputs.push_back(in.dtype());
  plan.outputs = {t, acc, acc, acc};
  plan.key = t;
  return plan;
}

std::vector<Shape> shapes(const OpArgs& a) {
  const Tensor& x = a.inputs[0];
  const std::string who = "[" + a.op.name + "] ";
  if (x.dim() < 2) throw ShapeError(who + "input must be (N, C) or (N, C, d...); got " + shape_str(x.shape()));
  const Params p = params_of(a.attrs);
  const Shape c{x.shape()[1]};
  const char* names[] = {"weight", "bias", "running_mean", "running_var"};
  const bool present[] = {p.weight, p.bias, p.rm, p.rv};
  for (std::size_t i = 0; i < 4; ++i)
    if (present[i] && a.inputs[i + 1].shape() != c)
      throw ShapeError(who + names[i] + " has shape " + shape_str(a.inputs[i + 1].shape()) + "; expected " +
                       shape_str(c));
  // Over several ranks a rank may even have no rows; alone, as batch_norm, it needs two values.
  if (!group_of(p, a.op.name.c_str()) && per_channel(x) < 2)
    throw ValueError(who + "training needs more than one value per channel; got input " + shape_str(x.shape()));
  return {x.shape(), c, c, c};
}

std::vector<Attrs> test_attrs() {
  std::vector<Attrs> sets;
  for (bool relu : {false, true})
    for (bool affine : {true, false})
      sets.push_back(Attrs{{"relu", relu}, {"momentum", 0.3}, {"has_weight", affine}, {"has_bias", affine}});
  return sets;
}

const OpRef kSyncBatchNorm = register_op({
    .name = "sync_batch_norm",
    .num_inputs = 5,
    .num_outputs = 4,
    .dtypes = dtype_sets::floating,
    .dtype_rule = dtypes,
    .shape_rule = shapes,
    .cpu = forward,
    .gpu = forward,
    .vjp = backward,
    // mean, invstd and the count are state for the backward pass.
    .differentiable_outputs = 1,
    .save = {.inputs = {0, 1}, .outputs = {0, 1, 2, 3}},
    .test = {.attrs = test_attrs(),
             .tolerance_scale = 4,
             .inputs = {{}, {}, {}, {}, {.low = 0.5, .high = 2}},
             .shapes = {{{2, 3, 5, 7}, {3}, {3}, {3}, {3}},
                        {{4, 3}, {3}, {3}, {3}, {3}},
                        {{9, 2, 37, 41}, {2}, {2}, {2}, {2}}}},
});

}  // namespace

std::shared_ptr<Collectives> group_collectives(ProcessGroup& group) {
  return std::make_shared<GroupCollectives>(group);
}

CollectivesHandle::CollectivesHandle(std::shared_ptr<Collectives> c) : collectives_(std::move(c)) {
  Handles& h = handles();
  const std::lock_guard lock(h.mu);
  id_ = h.next++;
  h.live.emplace(id_, collectives_);
}

CollectivesHandle::~CollectivesHandle() {
  Handles& h = handles();
  const std::lock_guard lock(h.mu);
  h.live.erase(id_);
}

std::shared_ptr<Collectives> find_collectives(std::int64_t id, const char* op) {
  Handles& h = handles();
  const std::lock_guard lock(h.mu);
  const auto it = h.live.find(id);
  if (it == h.live.end())
    throw ValueError("[" + std::string(op) + "] process group handle " + std::to_string(id) +
                     " is gone: the SyncBatchNorm that recorded this graph was destroyed before its backward");
  return it->second;
}

Tensor sync_batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, double momentum, double eps, Activation activation, std::int64_t group) {
  const Attrs attrs{{"relu", activation == Activation::relu},
                    {"momentum", momentum},
                    {"eps", eps},
                    {"has_weight", weight.defined()},
                    {"has_bias", bias.defined()},
                    {"has_running_mean", running_mean.defined()},
                    {"has_running_var", running_var.defined()},
                    {"group", group}};
  auto or_x = [&](const Tensor& t) { return t.defined() ? t : x; };
  const Tensor inputs[] = {x, or_x(weight), or_x(bias), or_x(running_mean), or_x(running_var)};
  return dispatch(kSyncBatchNorm, inputs, attrs)[0];  // the running statistics' copy_ bumps their versions
}

}  // namespace kiln::dist::detail
