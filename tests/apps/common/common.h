/* Helpers shared by the ACL workload programs. The programs know nothing of u3m:
 * they are plain ACL applications. Output conventions (tests parse them):
 *   - results go to stdout, one "key=value" or "key: value" fact per line;
 *   - an ACL error prints "ACL error <code> at <file>:<line>: <call>" to stderr
 *     and exits 2 (acl_replay adds the trace line number). */
#ifndef ACLAPP_COMMON_H_
#define ACLAPP_COMMON_H_

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define ACL_CHECK(call) do {                                                          \
        int rc_ = (int)(call);                                                         \
        if (rc_ != 0) app_acl_fail(rc_, __FILE__, __LINE__, #call);                    \
    } while (0)

/* Prints the ACL error and exits 2. */
void app_acl_fail(int code, const char *file, int line, const char *call) __attribute__((noreturn));
/* Prints "<prog>: <message>" to stderr and exits with `code`. */
void app_die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));

/* FNV-1a 64-bit, chainable: h = app_fnv(h, p, n); start from APP_FNV_INIT. */
#define APP_FNV_INIT 0xcbf29ce484222325ULL
uint64_t app_fnv(uint64_t h, const void *p, size_t n);

/* Deterministic PRNG (splitmix64) for reproducible data. */
uint64_t app_rand_u64(uint64_t *state);
/* Uniform float in [-scale, scale). */
float app_rand_f32(uint64_t *state, float scale);

/* Parses sizes like "4096", "64K", "2M", "1.5G" (binary units). Exits 3 on junk. */
uint64_t app_parse_size(const char *s, const char *what);
/* Parses a non-negative integer; exits 3 on junk. */
long long app_parse_int(const char *s, const char *what);

/* "--name=value" / "--name value" option helper: returns the value if argv[*i]
 * is option `name` (advancing *i past a separate value), else NULL. */
const char *app_opt(int argc, char **argv, int *i, const char *name);

/* Peak resident set size of this process in KiB (VmHWM), or 0 if unknown. */
long app_peak_rss_kb(void);

#endif
