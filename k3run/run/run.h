/*
 * run.h - the run room (k3run/run/): one generation from start to end, over
 * the engine and the text rooms. The loop prefills the prompt, samples and
 * streams each token (generate.h), driven by one run over a pack from the
 * prompt to the report (run_pack.h); per-token statistics (runstats.h) and the
 * debugging dump of every intermediate (dump.h) ride along. Later: sessions,
 * speculation, chat turns.
 */
#ifndef K3_RUN_H
#define K3_RUN_H

#include "dump.h"
#include "generate.h"
#include "run_pack.h"
#include "runstats.h"

#endif
