#pragma once
// Sets kiln's conv TF32 switch for a scope: tests that compare f32 convolutions exactly
// (GPU vs CPU modules, fused vs eager rounding) turn it off, TF32 tests turn it on.
#include "kiln/conv.h"

namespace kiln_test {

struct ConvTF32 {
  bool saved = kiln::allow_conv_tf32();
  explicit ConvTF32(bool on) { kiln::set_allow_conv_tf32(on); }
  ~ConvTF32() { kiln::set_allow_conv_tf32(saved); }
  ConvTF32(const ConvTF32&) = delete;
  ConvTF32& operator=(const ConvTF32&) = delete;
};

}  // namespace kiln_test
