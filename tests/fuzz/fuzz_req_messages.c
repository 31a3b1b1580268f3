/* fuzz_req_messages.c - libFuzzer target: POST /v1/messages and /v1/messages/count_tokens, through the server's checks (fuzz_request.h). */
#define FZ_API 2
#include "fuzz_request.h"
