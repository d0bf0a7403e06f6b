/* A slow disk for the soak (tests/soak/soak.py, fault `disk-slow`): LD_PRELOADed into a worker, it
 * delays every fsync() and fdatasync() by the seconds written in the file that
 * GENFLEET_TEST_FSYNC_DELAY_FILE names, while that file exists, then calls the real one. Python's
 * os.fsync calls libc's fsync, so the worker's own record writer (group commit) waits as it would on
 * a disk whose flushes take seconds. Built by the soak with `cc -shared -fPIC -o ... -ldl`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void delay(void) {
    const char *path = getenv("GENFLEET_TEST_FSYNC_DELAY_FILE");
    if (!path) return;
    FILE *file = fopen(path, "r");
    if (!file) return;
    double seconds = 0;
    if (fscanf(file, "%lf", &seconds) != 1) seconds = 0;
    fclose(file);
    if (seconds <= 0) return;
    struct timespec wait = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&wait, NULL);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    delay();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    delay();
    return real(fd);
}
