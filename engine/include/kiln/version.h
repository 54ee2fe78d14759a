#pragma once
namespace kiln {
const char* version();
}  // namespace kiln
