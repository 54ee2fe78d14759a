// The runtime including a tensor header: check_layers.cmake must refuse it.
#include "kiln/tensor.h"
