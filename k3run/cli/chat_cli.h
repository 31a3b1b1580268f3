/*
 * chat_cli.h - `k3run chat`: a conversation with the model on a terminal
 * (line editing and history through libedit), one question with -p, or a
 * request file with --messages; sessions with --save-session and
 * --load-session (docs/k3run-chat.md).
 */
#ifndef K3_CHAT_CLI_H
#define K3_CHAT_CLI_H

/* argv[0] is "chat". Returns the exit status. */
int k3_chat_main(int argc, char **argv);

#endif
