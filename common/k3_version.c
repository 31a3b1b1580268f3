/* k3_version.c - the first line of every tool's --version (k3_version.h). */
#include "k3_version.h"

void k3_version_print(FILE *f, const char *prog)
{
    fprintf(f, "%s %s (commit %s)\n", prog, K3_VERSION, k3_build_commit);
}
