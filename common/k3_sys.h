/* k3_sys.h - clocks and process facts. */
#ifndef K3_SYS_H
#define K3_SYS_H

#include <stdint.h>

double k3_now(void);               /* monotonic seconds */
uint64_t k3_peak_rss_bytes(void);  /* VmHWM of this process, 0 if unknown */

#endif
