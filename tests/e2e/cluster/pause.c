/* The pod sandbox's process (containerd's sandbox_image): holds the pod's namespaces,
 * reaps orphans, exits on SIGINT or SIGTERM. Built static, so the image is this file alone. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
