// PLACEHOLDER: CPU kernels for this family are registered here by their owner.
#include "core/kernels.h"
