/* Minimal test harness for the C tests (no dependencies). */
#ifndef MP_T_H
#define MP_T_H
#include <stdio.h>
#include <stdlib.h>

static int t_failures = 0, t_checks = 0;
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        t_checks++;                                                             \
        if (!(cond)) {                                                          \
            t_failures++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)
#define T_DONE(name)                                                            \
    do {                                                                        \
        printf("%s: %d checks, %d failures\n", name, t_checks, t_failures);     \
        return t_failures ? 1 : 0;                                              \
    } while (0)
#endif
