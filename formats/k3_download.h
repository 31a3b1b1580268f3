/*
 * k3_download.h - checking a downloaded checkpoint against its publisher's
 * hashes (docs/k3pack.md "Checking the download").
 *
 * Two sources of the hashes a file should have:
 *  - a Hugging Face cache snapshot (.../models--ORG--NAME/snapshots/REV/): each
 *    file is a symbolic link to ../../blobs/<name>, and the blob's name is the
 *    Hub's hash of its content: the SHA-256 for large (LFS) files such as the
 *    .safetensors, git's blob SHA-1 ("blob <size>\0" + content) for small ones
 *    such as config.json. Both are checked.
 *  - a SUMS file in the format `sha256sum` writes and checks ("HEX  NAME", or
 *    "HEX *NAME"; a leading backslash escapes \\ and \n in NAME; also the BSD
 *    "SHA256 (NAME) = HEX" form), for a checkpoint downloaded any other way.
 *    Names are matched by their last path component.
 *
 * SHA-256 and SHA-1 come from GNU Nettle (Debian's libnettle8, already under
 * libmicrohttpd through GnuTLS, so no new library): small, no global state,
 * and its x86-64 build picks the CPU's SHA extensions at run time.
 */
#ifndef K3_DOWNLOAD_H
#define K3_DOWNLOAD_H

#include <stddef.h>
#include <stdint.h>

#include <nettle/sha1.h>
#include <nettle/sha2.h>

#include "k3_error.h"

typedef enum { K3_DL_SHA256 = 1, K3_DL_GIT_SHA1 = 2 } k3_dl_kind;

/* What one file should hash to. */
typedef struct k3_dl_want {
    char name[256];              /* the file's name in the checkpoint directory */
    k3_dl_kind kind;
    uint8_t digest[32];          /* SHA-256, or (git) the first 20 bytes */
    char from[320];              /* where it was said: "SUMS line 3", "the Hub cache (blob ...)" */
} k3_dl_want;

typedef struct k3_dl {
    k3_dl_want *w;               /* [n] */
    size_t n;
    int hub;                     /* the directory is a Hugging Face cache snapshot */
    const char *sums;            /* the SUMS file, or NULL */
} k3_dl;

/*
 * The expected hashes of the files in checkpoint directory dir: from its Hub
 * cache links (when it is a snapshot) and from sums (NULL: none). A SUMS line
 * that cannot be read, a name given twice with two hashes, or a Hub link and a
 * SUMS line that disagree: K3_ERR_FORMAT naming the file and line.
 */
k3_err k3_dl_load(k3_dl *dl, const char *dir, const char *sums, k3_diag *d);
void k3_dl_free(k3_dl *dl);
const k3_dl_want *k3_dl_find(const k3_dl *dl, const char *name);   /* NULL: nothing to check it against */
/* "checked against the Hugging Face cache's hashes", "... SUMS", ...; or NULL when nothing is known. */
const char *k3_dl_what(const k3_dl *dl, char *buf, size_t cap);

/* One file's bytes hashed as they go by: its SHA-256 always, git's SHA-1 when w asks for it. */
typedef struct k3_dl_hash {
    struct sha256_ctx s;
    struct sha1_ctx g;
    int git;
    uint64_t n;                  /* bytes so far */
} k3_dl_hash;

void k3_dl_hash_begin(k3_dl_hash *h, const k3_dl_want *w, uint64_t size);   /* w may be NULL */
void k3_dl_hash_update(k3_dl_hash *h, const void *p, size_t n);
/* The file's SHA-256 into sha256 (may be NULL); checked against w (NULL: nothing to check): a mismatch
   is K3_ERR_CORRUPT naming path, where the hash was said, and both hashes. */
k3_err k3_dl_hash_end(k3_dl_hash *h, const k3_dl_want *w, const char *path, uint8_t sha256[32], k3_diag *d);
/* A whole file read once and checked the same way; *bytes its size. */
k3_err k3_dl_hash_file(const char *path, const k3_dl_want *w, uint8_t sha256[32], uint64_t *bytes, k3_diag *d);

void k3_dl_hex(const uint8_t *digest, size_t n, char *out);   /* out: 2n + 1 bytes, lowercase */
/* n hex digits (either case) into n/2 bytes; 0 if s[0..n) is not all hex digits. */
int k3_dl_unhex(const char *s, size_t n, uint8_t *out);

/* What the build checks downloads with, for --version: "SHA-256: nettle 3.8 (this CPU's SHA
   extensions: yes)". */
void k3_dl_describe(char *out, size_t cap);

#endif
