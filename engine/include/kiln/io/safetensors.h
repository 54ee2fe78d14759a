#pragma once
// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]}, "__metadata__": {..}}, then the raw little-endian data. Written so that
// other tools (e.g. Python's safetensors) read them.
#include <map>
#include <string>

#include "output_path.h"
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

// What a checkpoint may hold beside the model and the optimizer, e.g. what a trainer needs to
// continue a run: named tensors (stored as "extra.<name>") and metadata strings (JSON, say),
// stored beside "format" in the file's __metadata__.
struct CheckpointExtras {
  nn::NamedTensors tensors;
  Metadata metadata;
};

// A checkpoint: the module's state as "model.<name>", when given the optimizer's as
// "optim.<name>", and `extras`, in one file written as save_safetensors writes. ValueError for
// an extra metadata key "format" (the checkpoint's own).
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* opt = nullptr,
                     const CheckpointExtras& extras = {});
// Loads what save_checkpoint wrote; a file without optimizer state leaves `opt` as it is.
// ValueError naming the file for state the model or optimizer refuses (a wrong shape, a
// step count past 2^53, moments that are not finite); then neither is changed. With `extras`
// it receives the extra tensors (prefix taken off) and metadata (without "format"); without,
// they are ignored, so any checkpoint loads as a model and optimizer. A PyTorch state dict
// (see load_state_dict) loads into the model, leaving `opt` as it is and `extras` empty.
void load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt = nullptr,
                     CheckpointExtras* extras = nullptr);
// The extra metadata of a checkpoint (as load_checkpoint returns it), for deciding what to
// build before loading into it; IoError as load_checkpoint's for a file that is not one.
Metadata checkpoint_metadata(const std::string& path);
// A model's weights alone: a PyTorch state dict (safetensors.torch.save_file of
// model.state_dict(), with __metadata__ {"format": "pt"} or none), or a checkpoint's "model."
// part. The names are module.state()'s, which are PyTorch's: an nn::Sequential's children
// are "0", "1", ... ("0.weight", "1.running_mean", "1.num_batches_tracked"). ValueError
// naming every missing or unexpected tensor and each dtype or shape mismatch; then nothing
// is changed. IoError for another format ("tf", "flax").
void load_state_dict(const std::string& path, nn::Module& model);

}  // namespace kiln::io
