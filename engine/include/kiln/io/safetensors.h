#pragma once
// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]}, "__metadata__": {..}}, then the raw little-endian data. Written so that
// other tools (e.g. Python's safetensors) read them.
#include <map>
#include <string>

#include "kiln/io/output_path.h"
#include "kiln/nn/module.h"

namespace kiln::optim {
class Optimizer;
}

namespace kiln::io {

using Metadata = std::map<std::string, std::string>;

// Any device (copied to the host); names unique. ValueError for a duplicate or empty name.
// Written to a temporary file in the target's directory, flushed, fsynced and renamed over
// `path`, so a reader never sees half a file; IoError naming `path` when check_replaceable_file
// refuses it (a symlink, device node, fifo or directory there) or a write fails.
void save_safetensors(const std::string& path, const nn::NamedTensors& tensors, const Metadata& metadata = {});
// CPU tensors in file order. IoError naming the file and offset for a bad header,
// unknown dtype, overlapping or out-of-range data offsets, or a truncated file.
nn::NamedTensors load_safetensors(const std::string& path, Metadata* metadata = nullptr);

// Copies `from` into `into` by name (into each tensor's device, in place). ValueError listing
// every missing name, unexpected name, dtype and shape mismatch; nothing is copied unless
// all match. `what` names the target in the message, e.g. "model".
void copy_into(const nn::NamedTensors& from, const nn::NamedTensors& into, const std::string& what);

// A checkpoint: the module's state as "model.<name>" and, when given, the optimizer's as
// "optim.<name>" in one file, written as save_safetensors writes.
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* opt = nullptr);
// Loads what save_checkpoint wrote; a file without optimizer state leaves `opt` as it is.
// ValueError naming the file for state the model or optimizer refuses (a wrong shape, a
// step count past 2^53, moments that are not finite); then neither is changed.
// A PyTorch state dict (see load_state_dict) loads into the model, leaving `opt` as it is.
void load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt = nullptr);
// A model's weights alone: a PyTorch state dict (safetensors.torch.save_file of
// model.state_dict(), with __metadata__ {"format": "pt"} or none), or a checkpoint's "model."
// part. The names are module.state()'s, which are PyTorch's: an nn::Sequential's children
// are "0", "1", ... ("0.weight", "1.running_mean", "1.num_batches_tracked"). ValueError
// naming every missing or unexpected tensor and each dtype or shape mismatch; then nothing
// is changed. IoError for another format ("tf", "flax").
void load_state_dict(const std::string& path, nn::Module& model);

}  // namespace kiln::io
