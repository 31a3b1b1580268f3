/* k3_formats.h - umbrella facts about the formats library. */
#ifndef K3_FORMATS_H
#define K3_FORMATS_H

const char *k3_formats_version(void);

#endif
