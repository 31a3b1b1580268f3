/*
 * engine.h - the engine room (k3run/engine/): runs the model on a pack
 * within a memory budget. It opens and checks the pack (weights.h), plans
 * the memory before reading a weight (plan.h, plan_report.h), keeps or
 * streams the trunk and caches experts through reader threads, and computes
 * forward passes to logits (model.h), for one conversation or several
 * sharing each pass (batch.h). It knows nothing of text, sampling or
 * the command line, and uses only the kernels below it.
 *
 * This header is the engine's whole public face: every caller outside
 * engine/ (the run loop, main.c, k3inspect) includes it and nothing else of
 * the engine's (tests/cli/check_rooms.py enforces it).
 */
#ifndef K3_ENGINE_H
#define K3_ENGINE_H

#include "batch.h"
#include "model.h"
#include "plan.h"
#include "plan_report.h"
#include "weights.h"

#endif
