/*
 * chat_parse_message.c - the parsed answer as an OpenAI assistant message
 * (CHAT-FORMAT.md §9.3), one JSON object:
 *   {"role":"assistant","content":..,"reasoning_content":..,"tool_calls":[..]}
 */
#include "chat_parse_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int put_call(k3_chat_buf *b, const k3_chat_call *c, const char *id_prefix, size_t i)
{
    char num[32];                            /* the call's number, from 1 */
    snprintf(num, sizeof num, "%zu", i + 1);
    k3_chat_buf id = { 0 };                  /* id_prefix + num */
    int e = k3_chat_buf_puts(&id, id_prefix) || k3_chat_buf_puts(&id, num);
    e = e || k3_chat_buf_puts(b, i ? ",{\"id\":" : "{\"id\":") ||
        k3_chat_json_string(b, id.b, id.n) ||
        k3_chat_buf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":") ||
        k3_chat_json_string(b, (const uint8_t *)c->name, strlen(c->name)) ||
        k3_chat_buf_puts(b, ",\"arguments\":") ||
        k3_chat_json_string(b, (const uint8_t *)c->arguments, strlen(c->arguments)) ||
        k3_chat_buf_puts(b, "}}");
    k3_chat_buf_free(&id);
    return e ? -1 : 0;
}

static int build(const k3_chat_parser *p, const char *id_prefix, k3_chat_buf *b)
{
    size_t nc = k3_chat_parser_n_calls(p), n_content, n_reasoning;
    const uint8_t *content = k3_chat_parser_content(p, &n_content);
    const uint8_t *reasoning = k3_chat_parser_reasoning(p, &n_reasoning);
    if (!id_prefix) id_prefix = "call_";
    if (k3_chat_buf_puts(b, "{\"role\":\"assistant\",\"content\":")) return -1;
    if (nc && !n_content) {
        if (k3_chat_buf_puts(b, "null")) return -1;
    } else if (k3_chat_json_string(b, content, n_content)) {
        return -1;
    }
    if (k3_chat_buf_puts(b, ",\"reasoning_content\":")) return -1;
    if (!p->started_think && !n_reasoning) {
        if (k3_chat_buf_puts(b, "null")) return -1;
    } else if (k3_chat_json_string(b, reasoning, n_reasoning)) {
        return -1;
    }
    if (nc) {
        if (k3_chat_buf_puts(b, ",\"tool_calls\":[")) return -1;
        for (size_t i = 0; i < nc; i++)
            if (put_call(b, k3_chat_parser_call(p, i), id_prefix, i)) return -1;
        if (k3_chat_buf_puts(b, "]")) return -1;
    }
    return k3_chat_buf_puts(b, "}");
}

k3_err k3_chat_message_json(const k3_chat_parser *p, const char *id_prefix, char **out, size_t *len,
                            k3_diag *d)
{
    k3_chat_buf b = { 0 };                   /* the message's JSON text */
    if (build(p, id_prefix, &b)) {
        k3_chat_buf_free(&b);
        return k3_fail(d, K3_ERR_NOMEM, "out of memory writing the assistant message");
    }
    *out = (char *)b.b;
    if (len) *len = b.n;
    return K3_OK;
}

k3_err k3_chat_message_write(const k3_chat_parser *p, const char *id_prefix, FILE *f, k3_diag *d)
{
    char *s = NULL;
    size_t n = 0;
    k3_err e = k3_chat_message_json(p, id_prefix, &s, &n, d);
    if (e) return e;
    size_t w = fwrite(s, 1, n, f);
    free(s);
    if (w != n) return k3_fail(d, K3_ERR_IO, "cannot write the assistant message");
    return K3_OK;
}
