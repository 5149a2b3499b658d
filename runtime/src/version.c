#include "moepack.h"

/* The one version string lives in moepack/__init__.py; setup.py and runtime/Makefile pass it
   in. Other builds (e.g. a test that compiles the sources by hand) say so instead of guessing. */
#ifndef MOEPACK_VERSION
#define MOEPACK_VERSION "unknown (built without -DMOEPACK_VERSION)"
#endif

const char *mp_version(void) { return MOEPACK_VERSION; }
