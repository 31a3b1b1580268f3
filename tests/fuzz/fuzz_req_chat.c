/* fuzz_req_chat.c - libFuzzer target: POST /v1/chat/completions, through the server's checks (fuzz_request.h). */
#define FZ_API 0
#include "fuzz_request.h"
