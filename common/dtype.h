// Moved: the tensor element types are public, include/gradsnap/dtype.h.
#include "gradsnap/dtype.h"  // IWYU pragma: export
