#ifndef ROAM_CSHIMS_H
#define ROAM_CSHIMS_H
#include <stdint.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

/// Wraps `NLMSG_ALIGN`.
static inline uint32_t CShims_NLMSG_ALIGN(uint32_t n) { return NLMSG_ALIGN(n); }
/// Wraps `NLMSG_HDRLEN`.
static inline uint32_t CShims_NLMSG_HDRLEN(void) { return NLMSG_HDRLEN; }
/// Wraps `RTA_ALIGN`.
static inline uint32_t CShims_RTA_ALIGN(uint32_t n) { return RTA_ALIGN(n); }

#endif
