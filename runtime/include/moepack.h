/* Public C API of the moepack engine. */
#ifndef MOEPACK_H
#define MOEPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MP_API __attribute__((visibility("default")))
#else
#define MP_API
#endif

/* Version of the engine library, "MAJOR.MINOR.PATCH". */
MP_API const char *mp_version(void);

#ifdef __cplusplus
}
#endif
#endif
