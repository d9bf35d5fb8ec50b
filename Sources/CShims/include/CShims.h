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

// MARK: Process hardening

#include <sys/prctl.h>

/// prctl(PR_SET_DUMPABLE, 0): no core dumps, and /proc/self owned by root (prctl is variadic).
static inline int prctl_set_dumpable_zero(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }
/// prctl(PR_GET_DUMPABLE).
static inline int prctl_get_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

// MARK: Tunnel data plane

#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <linux/if_tun.h>

/// Makes `fd` (an open /dev/net/tun) a layer-3 TUN device named exactly `name`, without the
/// packet-information prefix: `TUNSETIFF` with `IFF_TUN | IFF_NO_PI | IFF_TUN_EXCL`, so an
/// existing interface of that name is an error (EBUSY) instead of being attached to. The
/// request is a `struct ifreq`, spelled out because <net/if.h> and <linux/if.h> collide.
static inline int CShims_tun_set_iff(int fd, const char *name) {
    struct { char name[16]; short flags; char pad[22]; } request;
    memset(&request, 0, sizeof request);
    strncpy(request.name, name, sizeof request.name - 1);
    request.flags = (short)(IFF_TUN | IFF_NO_PI | IFF_TUN_EXCL);  // 0x9001: the top bit is a flag
    return ioctl(fd, TUNSETIFF, &request);
}

/// `struct mmsghdr`: one datagram of a sendmmsg/recvmmsg batch. glibc hides the struct and
/// both calls behind _GNU_SOURCE, so they are declared here under their real symbol names.
struct CShims_mmsghdr { struct msghdr msg_hdr; unsigned int msg_len; };
extern int CShims_sendmmsg(int fd, struct CShims_mmsghdr *messages, unsigned int count, int flags)
    __asm__("sendmmsg");
extern int CShims_recvmmsg(int fd, struct CShims_mmsghdr *messages, unsigned int count, int flags,
                           struct timespec *timeout) __asm__("recvmmsg");

#endif
