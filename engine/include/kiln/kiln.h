#pragma once
// The one header a program embedding kiln includes. No CUDA types appear here.
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/version.h"
