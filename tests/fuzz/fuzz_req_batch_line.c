/* fuzz_req_batch_line.c - libFuzzer target: one line of k3run batch's input, through the server's checks (fuzz_request.h). */
#define FZ_API 4
#include "fuzz_request.h"
