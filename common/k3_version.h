/*
 * k3_version.h - what `--version` says: the version, the commit the binary was
 * built from (common/build_info.cmake; "+changes" when the tree had uncommitted
 * changes, "unknown" without git), and what each tool adds (k3run: its kernels,
 * MPI and TLS).
 */
#ifndef K3_VERSION_H
#define K3_VERSION_H

#include <stdio.h>

extern const char k3_build_commit[];

/* "PROG VERSION (commit C)" and a newline on f. */
void k3_version_print(FILE *f, const char *prog);

#endif
