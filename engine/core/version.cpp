#include "kiln/version.h"

namespace kiln {
const char* version() { return "0.1.0"; }
}  // namespace kiln
