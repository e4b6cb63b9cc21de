/* A disk whose fsync fails once, for tests (LD_PRELOAD; testkit's
 * `failsync_library` builds it). Once the file named by FAILSYNC_TRIGGER
 * exists, holding a number N (none: 0), the process's next N fsync and
 * fdatasync calls go through and the one after fails with EIO; the file is
 * removed then, and every later call goes to the C library again. One
 * failure and then success is what a retry would see on Linux after a
 * failed writeback: the kernel reports the error once, and may have dropped
 * the dirty pages (PostgreSQL's "fsyncgate"), so a retry that succeeds
 * proves nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Calls to let through before the failing one; -1 until armed. */
static atomic_long countdown = -1;
static atomic_int fired = 0;

static int fail_now(void) {
    const char *trigger = getenv("FAILSYNC_TRIGGER");
    if (trigger == NULL || atomic_load(&fired)) return 0;
    if (atomic_load(&countdown) < 0) {
        FILE *file = fopen(trigger, "r");
        if (file == NULL) return 0;
        long skip = 0;
        if (fscanf(file, "%ld", &skip) != 1 || skip < 0) skip = 0;
        fclose(file);
        long unarmed = -1;
        atomic_compare_exchange_strong(&countdown, &unarmed, skip);
    }
    if (atomic_fetch_sub(&countdown, 1) != 0) return 0;
    atomic_store(&fired, 1);
    unlink(trigger);
    return 1;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (fail_now()) { errno = EIO; return -1; }
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (fail_now()) { errno = EIO; return -1; }
    return real(fd);
}
