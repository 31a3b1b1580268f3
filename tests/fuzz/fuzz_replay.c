/*
 * fuzz_replay.c - run a fuzz target's LLVMFuzzerTestOneInput over files and
 * directories of inputs without libFuzzer (ctest in ordinary and sanitizer
 * builds; reproducing a crasher). Usage: <target>_replay PATH...
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b) { free(buf); buf = NULL; }
            buf = b;
        }
    }
    fclose(f);
    if (getenv("K3_FUZZ_VERBOSE")) fprintf(stderr, "%s\n", path);
    if (!buf) { fprintf(stderr, "%s: out of memory\n", path); return -1; }
    /* an exact-size copy, so ASan sees reads past the input */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) { free(buf); return -1; }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, errors = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { perror(argv[i]); errors++; continue; }
        if (!S_ISDIR(st.st_mode)) { errors += run_file(argv[i]) != 0; files++; continue; }
        DIR *dh = opendir(argv[i]);
        if (!dh) { perror(argv[i]); errors++; continue; }
        struct dirent *de;
        while ((de = readdir(dh))) {
            if (de->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], de->d_name);
            errors += run_file(p) != 0;
            files++;
        }
        closedir(dh);
    }
    printf("%d inputs replayed, %d unreadable\n", files, errors);
    return errors || files == 0;
}
