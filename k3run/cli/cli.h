/*
 * cli.h - the cli room (k3run/cli/): k3run's terminal front ends over the run
 * room. One run over a pack from the prompt to the report (run_pack.h), with
 * its perplexity mode (perplexity.h) and the debugging dump of every
 * intermediate (dump.h); `k3run chat` (chat_cli.h: options and modes,
 * chat_app.h: a conversation and its display, chat_repl.c: the interactive
 * loop). The server, the other front end, is serve/.
 */
#ifndef K3_CLI_H
#define K3_CLI_H

#include "chat_cli.h"
#include "dump.h"
#include "run_pack.h"

#endif
