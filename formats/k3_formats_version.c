/* k3_formats_version.c - version string of the formats library. */
#include "k3_formats.h"

const char *k3_formats_version(void) { return K3_VERSION; }
