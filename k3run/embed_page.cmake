# Turn a file into a C source holding it as a NUL-terminated array (the chat page of `k3run serve`).
#   cmake -DIN=page.html -DOUT=serve_page.c -DNAME=k3_serve_page -P embed_page.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* generated from ${IN} by k3run/embed_page.cmake: do not edit */\n"
     "const char ${NAME}[] = {\n${body}0x00};\nconst unsigned long ${NAME}_len = ${bytes};\n")
