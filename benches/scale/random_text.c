/* LD_PRELOAD for link-order.sh: before main, marks the executable's own mappings
 * MADV_RANDOM. On older kernels that turned off read-around for them, so (with the
 * file out of the page cache) each code page the run touches was read and mapped
 * alone and /proc/PID/pagemap showed exactly those. On recent ones (6.18 here) code is
 * read ahead whatever madvise says, and link-order.sh turns the device's read-ahead
 * off instead. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((constructor)) static void random_text(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps)
        return;
    char line[PATH_MAX + 256];
    while (fgets(line, sizeof line, maps)) {
        unsigned long start, end;
        char path[PATH_MAX] = "";
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %4095s", &start, &end, path) == 3 &&
            strcmp(path, exe) == 0)
            madvise((void *)start, end - start, MADV_RANDOM);
    }
    fclose(maps);
}
