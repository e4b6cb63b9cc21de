/* A disk that fills up and empties again, for tests (LD_PRELOAD; testkit's
 * `fulldisk_library` builds it). While the file named by FULLDISK_TRIGGER
 * exists, every write to a file whose path starts with a line of the
 * trigger (a data directory, ending in '/') fails with ENOSPC, as on a
 * full file system;
 * once it is removed, writes go through again (space came back). Other
 * files (the node's own log on stderr) are untouched.
 *
 * Why not RLIMIT_FSIZE: it fails writes past an offset, and the log's
 * segments are preallocated, so when it bites depends on where the current
 * segment's end happens to be. This one bites when the test says. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The trigger is looked at most once per this, so that a write costs a
 * clock read, not a system call, while the disk is not full. */
#define CHECK_EVERY_NS 2000000L

static atomic_long next_check_ns = 0;
/* The data directories while their disks are full, one per line. */
static char full_under[4 * PATH_MAX];
static atomic_int full = 0;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int disk_full(void) {
    const char *trigger = getenv("FULLDISK_TRIGGER");
    if (trigger == NULL) return 0;
    long now = now_ns();
    if (now >= atomic_load(&next_check_ns)) {
        atomic_store(&next_check_ns, now + CHECK_EVERY_NS);
        FILE *file = fopen(trigger, "r");
        if (file == NULL) {
            atomic_store(&full, 0);
        } else {
            char prefixes[sizeof full_under] = {0};
            size_t n = fread(prefixes, 1, sizeof prefixes - 1, file);
            if (n > 0) {
                memcpy(full_under, prefixes, sizeof prefixes);
                atomic_store(&full, 1);
            }
            fclose(file);
        }
    }
    return atomic_load(&full);
}

/* Whether `fd` is a file under one of the full data directories. */
static int refused(int fd) {
    if (!disk_full()) return 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    for (const char *line = full_under; *line != 0;) {
        size_t length = strcspn(line, "\n");
        if (length > 0 && strncmp(path, line, length) == 0) {
            errno = ENOSPC;
            return 1;
        }
        line += length;
        if (*line == '\n') line++;
    }
    return 0;
}

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);

/* The C library's own `name`, looked up once. */
#define REAL(name, type) \
    static type real; \
    if (real == NULL) real = (type)dlsym(RTLD_NEXT, name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL("write", write_fn);
    if (refused(fd)) return -1;
    return real(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL("pwrite", pwrite_fn);
    if (refused(fd)) return -1;
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL("pwrite64", pwrite_fn);
    if (refused(fd)) return -1;
    return real(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    REAL("writev", writev_fn);
    if (refused(fd)) return -1;
    return real(fd, iov, iovcnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    REAL("pwritev", pwritev_fn);
    if (refused(fd)) return -1;
    return real(fd, iov, iovcnt, offset);
}
