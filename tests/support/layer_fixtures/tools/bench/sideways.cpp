// A tool reaching into the engine and the tests: check_layers.cmake must refuse both.
#include "../../tests/gpu/consistency_cases.h"
#include "ops/conv_igemm.h"
