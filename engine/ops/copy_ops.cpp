// cast, clone and to_device: copies that autograd sees through.
#include "core/registry.h"
#include "core/step/step_state.h"
#include "core/tensor/copy.h"

namespace kiln {

namespace {

void copy_impl(const OpArgs& a, std::span<Tensor> out) { copy_into(a.inputs[0], out[0]); }

// The engine casts each gradient back to its input's dtype, so this is the identity.

const OpRef kCast = register_op({
    .name = "cast",
    .dtypes = {kAllDTypes.begin(), kAllDTypes.end()},
    .dtype_rule =
        [](const OpArgs& a) {
          const DType in = a.inputs[0].dtype();
          return DTypePlan{{in}, {a.attrs.get<DType>("dtype")}, in};
        },
    .shape_rule = rules::same_shape_as_input,
    .cpu = copy_impl,
    .gpu = copy_impl,
    // The kernel copy_impl launches for a conversion: the template's cvt does the work.
    .pointwise = PointwiseExpr{.expr = "x", .domain = kernels::PointwiseDomain::all_pairs},
    .vjp = rules::pass_through,
    .test = {.attrs = {Attrs{{"dtype", DType::f32}}, Attrs{{"dtype", DType::f16}}, Attrs{{"dtype", DType::bf16}},
                       Attrs{{"dtype", DType::f64}}, Attrs{{"dtype", DType::i32}}, Attrs{{"dtype", DType::i64}},
                       Attrs{{"dtype", DType::u8}}, Attrs{{"dtype", DType::boolean}}},
             .gradcheck = false},
});

const OpRef kClone = register_op({
    .name = "clone",
    .dtypes = {kAllDTypes.begin(), kAllDTypes.end()},
    .dtype_rule = rules::same_as_input,
    .shape_rule = rules::same_shape_as_input,
    .cpu = copy_impl,
    .gpu = copy_impl,
    .vjp = rules::pass_through,
});

// Host <-> device through a contiguous host copy; cuda -> cuda goes through the host too.
void transfer(const OpArgs& a, std::span<Tensor> out) {
  const Device to = a.attrs.get<Device>("device");
  Tensor host = host_contiguous(a.inputs[0]);
  out[0] = to.is_cpu() ? host : from_data(host.data_ptr(), host.shape(), host.dtype(), to);
  if (out[0].is_same(a.inputs[0])) out[0] = convert(host, host.dtype());
}

const OpRef kToDevice = register_op({
    .name = "to_device",
    .dtype_rule = rules::same_as_input,
    .shape_rule = rules::same_shape_as_input,
    .cpu = transfer,
    .gpu = transfer,
    .makes_outputs = true,
    .vjp = [](const VjpContext& c, std::span<const Tensor> g) -> std::vector<Tensor> {
      return {g[0].to(c.input(0).device)};
    },
    .test = {.attrs = {Attrs{{"device", Device::cpu()}}}},
});

}  // namespace

Tensor cast(const Tensor& a, DType dtype) {
  // A compiled step's cast of its input (autocast's of the images): the graph's input copy writes it.
  if (std::optional<Tensor> copied = step::input_cast(a, dtype)) return *copied;
  return call(kCast, {a}, Attrs{{"dtype", dtype}});
}

}  // namespace kiln
