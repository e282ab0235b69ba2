/* How long an event loop works between two polls, measured in the server's own process.

   Loaded with LD_PRELOAD by benchmarks/loop_busy.py.  asyncio's selector
   loop polls with epoll_wait, uvloop's libuv with epoll_pwait: between the
   return of one poll and the call of the next, the loop runs callbacks and
   looks at no socket, so a request that arrives then waits at least until
   the next poll.  That time (a "busy stretch") is the loop's stall as a
   client meets it, without the client's or the kernel's share.

   Each stretch of at least LOOP_BUSY_MIN_NS nanoseconds (20,000 by
   default) is kept, with when it ended on CLOCK_MONOTONIC (Python's
   time.monotonic), in the file LOOP_BUSY_OUT, mapped shared, so that it
   holds them however the process ends (uvicorn ends by its signal once it
   has shut down): a 64-bit count of the stretches recorded, then for each
   of the first CAPACITY (a count above CAPACITY: the others had no room)
   three 64-bit numbers: when it ended and its length, in nanoseconds, and
   how many times the kernel gave the CPU to another task within it
   (involuntary context switches, from getrusage at each poll's return and
   at the end of a stretch kept): a stretch with any is the machine's as
   much as the loop's.  The file is written whole at load, so the
   process's memory does not grow with what it records.  Nothing is done
   without LOOP_BUSY_OUT. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define CAPACITY (1 << 18)

struct stretch {
    int64_t end;
    int64_t length;
    /* Involuntary context switches within it: the CPU was given to another task. */
    int64_t preempted;
};
static struct record {
    uint64_t recorded;
    struct stretch stretches[CAPACITY];
} *record;
static int64_t threshold = 20000;
/* When this thread's last poll returned (0 before its first), and its involuntary switches then. */
static __thread int64_t returned;
static __thread long switches;

static int (*real_epoll_wait)(int, struct epoll_event *, int, int);
static int (*real_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static long involuntary_switches(void)
{
    struct rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nivcsw;
}

static void poll_begins(void)
{
    if (record == NULL || returned == 0)
        return;
    int64_t now = now_ns();
    int64_t length = now - returned;
    if (length < threshold)
        return;
    uint64_t i = __atomic_fetch_add(&record->recorded, 1, __ATOMIC_RELAXED);
    if (i < CAPACITY) {
        record->stretches[i].end = now;
        record->stretches[i].length = length;
        record->stretches[i].preempted = involuntary_switches() - switches;
    }
}

static void poll_ended(void)
{
    if (record != NULL) {
        returned = now_ns();
        switches = involuntary_switches();
    }
}

int epoll_wait(int epfd, struct epoll_event *events, int maxevents, int timeout)
{
    poll_begins();
    int n = real_epoll_wait(epfd, events, maxevents, timeout);
    poll_ended();
    return n;
}

int epoll_pwait(int epfd, struct epoll_event *events, int maxevents, int timeout, const sigset_t *sigmask)
{
    poll_begins();
    int n = real_epoll_pwait(epfd, events, maxevents, timeout, sigmask);
    poll_ended();
    return n;
}

__attribute__((constructor)) static void load(void)
{
    real_epoll_wait = (int (*)(int, struct epoll_event *, int, int))dlsym(RTLD_NEXT, "epoll_wait");
    real_epoll_pwait =
        (int (*)(int, struct epoll_event *, int, int, const sigset_t *))dlsym(RTLD_NEXT, "epoll_pwait");
    const char *min = getenv("LOOP_BUSY_MIN_NS");
    if (min != NULL)
        threshold = strtoll(min, NULL, 10);
    const char *out = getenv("LOOP_BUSY_OUT");
    if (out == NULL)
        return;
    int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, sizeof *record) != 0) {
        perror("loop_busy: LOOP_BUSY_OUT");
        exit(70);
    }
    void *mapped = mmap(NULL, sizeof *record, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED) {
        perror("loop_busy: mmap");
        exit(70);
    }
    memset(mapped, 0, sizeof *record);
    record = mapped;
}
