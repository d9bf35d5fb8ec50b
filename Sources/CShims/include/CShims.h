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

/// setns(2) into a network namespace. Declared here because glibc hides it behind
/// _GNU_SOURCE, which the system module is not built with.
extern int setns(int fd, int nstype);
static inline int CShims_setns_net(int fd) { return setns(fd, 0x40000000 /* CLONE_NEWNET */); }

#endif
