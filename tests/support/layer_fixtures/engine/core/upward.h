#pragma once
// A core header reaching up into engine/compile: check_layers.cmake must refuse it.
#include "compile/fusion.h"
