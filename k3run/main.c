/*
 * k3run - generate text from a k3 pack.
 *
 * Not implemented yet: this binary prints its help and refuses to run, so
 * nothing pretends to work. See the issue tracker for the plan.
 */
#include <stdio.h>
#include <string.h>

#include "k3_error.h"
#include "k3_log.h"
#include "k3_opts.h"

static const k3_opt opts[] = {
    K3_OPTS_COMMON,
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

int main(int argc, char **argv)
{
    k3_log_init(argv[0]);
    k3_args a;
    k3_diag d;
    if (k3_opts_parse(opts, N_OPTS, argc, argv, &a, &d)) return k3_usage_error("%s", d.msg);
    if (k3_opt_count(&a, K3_OPT_HELP)) {
        k3_opts_help(stdout, "k3run [OPTIONS] PACK", "generate text from a k3 pack.\n\nNot implemented yet: the runtime (kernels, KDA, MLA, MoE, expert cache) is not built yet.", opts, N_OPTS, "");
        return K3_EXIT_OK;
    }
    if (k3_opt_count(&a, K3_OPT_VERSION)) {
        printf("%s %s\n", k3_log_prog(), K3_VERSION);
        return K3_EXIT_OK;
    }
    k3_error("not implemented yet: the runtime (kernels, KDA, MLA, MoE, expert cache) is not built yet.");
    return K3_EXIT_USAGE;
}
