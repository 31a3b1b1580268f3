/*
 * serve_messages.c - (being written)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

static int to_chat(srv *s, const char *body, size_t len, char **chat, size_t *chat_len, void **state, char *msg,
                   size_t cap)
{
    (void)s; (void)body; (void)len; (void)chat; (void)chat_len; (void)state;
    snprintf(msg, cap, "not implemented yet");
    return 501;
}

const srv_api_ops srv_api_messages = {
    .name = "messages", .to_chat = to_chat, .error_json = srv_api_error_json,
};

char *srv_messages_count_tokens(srv *s, const char *body, size_t len, int *status, char *msg, size_t cap)
{
    (void)s; (void)body; (void)len;
    *status = 501;
    snprintf(msg, cap, "not implemented yet");
    return NULL;
}
