/* fuzz_req_responses.c - libFuzzer target: POST /v1/responses, through the server's checks (fuzz_request.h). */
#define FZ_API 3
#include "fuzz_request.h"
