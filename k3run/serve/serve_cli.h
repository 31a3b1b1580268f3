/*
 * serve_cli.h - `k3run serve`: the OpenAI-compatible HTTP server over a pack
 * (docs/k3run-serve.md). main.c hands it the arguments after "serve".
 */
#ifndef K3_SERVE_CLI_H
#define K3_SERVE_CLI_H

int k3_serve_main(int argc, char **argv);

#endif
