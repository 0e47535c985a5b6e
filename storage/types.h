// Moved: the checkpoint data model is public, include/gradsnap/types.h.
#include "gradsnap/types.h"  // IWYU pragma: export
