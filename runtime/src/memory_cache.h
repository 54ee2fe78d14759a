#pragma once
// Internal: the block cache of memory.cpp, for the stream that is being destroyed.

namespace kiln::rt {

// Frees the blocks parked for `stream` before the stream goes away, since a later stream
// with the same handle would not be ordered after the old one's work. Never throws.
void release_stream_blocks(int device, void* stream) noexcept;

}  // namespace kiln::rt
