#include "common/common.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

extern const char *__progname;

void app_acl_fail(int code, const char *file, int line, const char *call) {
    fprintf(stderr, "%s: ACL error %d at %s:%d: %s\n", __progname, code, file, line, call);
    fflush(stdout);
    exit(2);
}

void app_die(int code, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", __progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stdout);
    exit(code);
}

uint64_t app_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t app_rand_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

float app_rand_f32(uint64_t *state, float scale) {
    double u = (double)(app_rand_u64(state) >> 11) / (double)(1ULL << 53);
    return (float)((u * 2.0 - 1.0) * scale);
}

uint64_t app_parse_size(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0) app_die(3, "bad %s '%s': expected a size like 4096, 64K, 2M, 1.5G", what, s);
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: app_die(3, "bad %s '%s': unknown unit '%c'", what, s, *end);
        }
        end++;
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
        if (*end) app_die(3, "bad %s '%s': trailing characters", what, s);
    }
    return (uint64_t)(v * mul);
}

long long app_parse_int(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno != 0 || v < 0) app_die(3, "bad %s '%s': expected a non-negative integer", what, s);
    return v;
}

const char *app_opt(int argc, char **argv, int *i, const char *name) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != 0) return NULL;
    if (*i + 1 >= argc) app_die(3, "option %s needs a value", name);
    (*i)++;
    return argv[*i];
}

long app_peak_rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}
