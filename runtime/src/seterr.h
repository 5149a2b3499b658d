/* Error messages for functions that take (char *err, size_t errlen): err may be NULL. */
#ifndef MP_SETERR_H
#define MP_SETERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void mp_vseterr(char *err, size_t errlen, const char *fmt, va_list ap) {
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
}

/* Formats the message into err and returns code, so `return mp_seterr(err, errlen, MP_E..., ...)`. */
static inline int mp_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int mp_seterr(char *err, size_t errlen, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mp_vseterr(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

#endif
