/*
 * serve_cli.h - `k3run serve`: the OpenAI-compatible HTTP server over a pack
 * (docs/k3run-serve.md). main.c hands it the arguments after "serve".
 */
#ifndef K3_SERVE_CLI_H
#define K3_SERVE_CLI_H

int k3_serve_main(int argc, char **argv);
/* `k3run batch` (batch_cli.c): a file of Batch API requests through the same slots. */
int k3_batch_main(int argc, char **argv);

/* --version's line about HTTPS: libmicrohttpd's version and whether it has TLS. */
const char *k3_serve_tls_line(void);

#endif
