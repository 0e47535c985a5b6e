// Moved: the client's public interface is include/gradsnap/client.h.
#include "gradsnap/client.h"  // IWYU pragma: export
