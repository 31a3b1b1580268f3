/*
 * run.h - the run room (k3run/run/): one conversation's core, over the engine
 * and the text rooms: bringing a pack up (load.h), the loop that prefills the
 * prompt, samples and streams each token (generate.h) with drafts (decode.h,
 * draft.h), chat turns with the prompt cache (chat.h), sessions (session.h)
 * and per-token statistics (runstats.h). The front ends that drive it are
 * the rooms above: cli/ (a run from the terminal, k3run chat) and serve/.
 */
#ifndef K3_RUN_H
#define K3_RUN_H

#include "generate.h"
#include "runstats.h"

#endif
