#include "moepack.h"

const char *mp_version(void) { return "0.1.0"; }
