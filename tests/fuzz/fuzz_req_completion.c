/* fuzz_req_completion.c - libFuzzer target: POST /v1/completions, through the server's checks (fuzz_request.h). */
#define FZ_API 1
#include "fuzz_request.h"
