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
/// unshare(2), hidden the same way: a mount namespace of its own, and with `user` a user
/// namespace too (CLONE_NEWNS, CLONE_NEWUSER).
extern int unshare(int flags);
static inline int CShims_unshare_mounts(int user) { return unshare(0x00020000 | (user ? 0x10000000 : 0)); }

// MARK: Process hardening

#include <sys/prctl.h>

/// prctl(PR_SET_DUMPABLE, 0): no core dumps, and /proc/self owned by root (prctl is variadic).
static inline int prctl_set_dumpable_zero(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }
/// prctl(PR_GET_DUMPABLE).
static inline int prctl_get_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

// MARK: Memory

#include <malloc.h>

/// Gives the pages malloc holds free back to the system (after a large read is let go).
static inline void CShims_trim_memory(void) { (void)malloc_trim(0); }

// MARK: Tunnel data plane

#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <linux/if_tun.h>

/// Makes `fd` (an open /dev/net/tun) a layer-3 TUN device named exactly `name`, without the
/// packet-information prefix: `TUNSETIFF` with `IFF_TUN | IFF_NO_PI`. With `vnet`, every read
/// and write starts with a `virtio_net_hdr` (`IFF_VNET_HDR`), the way for the kernel to hand
/// over and take back offloaded packets. With `multiqueue`, the device has a queue per
/// descriptor attached to it (`IFF_MULTI_QUEUE`). With `exclusive` (`IFF_TUN_EXCL`), an existing
/// interface of that name is an error (EBUSY) instead of being attached to; further queues of a
/// multi-queue device attach without it. The request is a `struct ifreq`, spelled out because
/// <net/if.h> and <linux/if.h> collide.
static inline int CShims_tun_set_iff(int fd, const char *name, int vnet, int multiqueue, int exclusive) {
    struct { char name[16]; short flags; char pad[22]; } request;
    memset(&request, 0, sizeof request);
    strncpy(request.name, name, sizeof request.name - 1);
    int flags = IFF_TUN | IFF_NO_PI;  // IFF_TUN_EXCL is 0x8000: the top bit of a short
    if (vnet) flags |= IFF_VNET_HDR;
    if (multiqueue) flags |= IFF_MULTI_QUEUE;
    if (exclusive) flags |= IFF_TUN_EXCL;
    request.flags = (short)flags;
    return ioctl(fd, TUNSETIFF, &request);
}

/// The offloads (`TUN_F_*`) the reader of a vnet-header TUN device takes on.
static inline int CShims_tun_set_offload(int fd, unsigned int flags) {
    return ioctl(fd, TUNSETOFFLOAD, (unsigned long)flags);
}
static const unsigned int CSHIMS_TUN_F_CSUM = TUN_F_CSUM;
static const unsigned int CSHIMS_TUN_F_TSO4 = TUN_F_TSO4;
static const unsigned int CSHIMS_TUN_F_TSO6 = TUN_F_TSO6;
static const unsigned int CSHIMS_TUN_F_TSO_ECN = TUN_F_TSO_ECN;

/// `struct mmsghdr`: one datagram of a sendmmsg/recvmmsg batch. glibc hides the struct and
/// both calls behind _GNU_SOURCE, so they are declared here under their real symbol names.
struct CShims_mmsghdr { struct msghdr msg_hdr; unsigned int msg_len; };
extern int CShims_sendmmsg(int fd, struct CShims_mmsghdr *messages, unsigned int count, int flags)
    __asm__("sendmmsg");
extern int CShims_recvmmsg(int fd, struct CShims_mmsghdr *messages, unsigned int count, int flags,
                           struct timespec *timeout) __asm__("recvmmsg");

// MARK: The address a datagram was sent to, and the one to send from (IP_PKTINFO)

#include <sys/socket.h>
#include <netinet/in.h>
#include <string.h>
// glibc declares these only under _GNU_SOURCE; the kernel's layout (linux/in.h, linux/ipv6.h).
struct CShims_in_pktinfo { int ipi_ifindex; struct in_addr ipi_spec_dst; struct in_addr ipi_addr; };
struct CShims_in6_pktinfo { struct in6_addr ipi6_addr; int ipi6_ifindex; };
#ifndef IP_PKTINFO
#define IP_PKTINFO 8
#endif
#define CSHIMS_IPV6_RECVPKTINFO 49
#define CSHIMS_IPV6_PKTINFO 50


/// Turns on the destination address of every datagram received (IP_PKTINFO / IPV6_RECVPKTINFO).
static inline int CShims_enable_pktinfo(int fd, int family) {
    int on = 1;
    return family == AF_INET6 ? setsockopt(fd, IPPROTO_IPV6, CSHIMS_IPV6_RECVPKTINFO, &on, sizeof on)
                              : setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on);
}

/// The address a received datagram was sent to, from its control messages: writes 4 or 16
/// bytes to `out` and returns AF_INET or AF_INET6; 0 when there is none.
static inline int CShims_read_pktinfo(const struct msghdr *message, unsigned char out[16]) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)message); c; c = CMSG_NXTHDR((struct msghdr *)message, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO && c->cmsg_len >= CMSG_LEN(sizeof(struct CShims_in_pktinfo))) {
            struct CShims_in_pktinfo info;
            memcpy(&info, CMSG_DATA(c), sizeof info);
            memcpy(out, &info.ipi_addr, 4);
            return AF_INET;
        }
        if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == CSHIMS_IPV6_PKTINFO && c->cmsg_len >= CMSG_LEN(sizeof(struct CShims_in6_pktinfo))) {
            struct CShims_in6_pktinfo info;
            memcpy(&info, CMSG_DATA(c), sizeof info);
            memcpy(out, &info.ipi6_addr, 16);
            return AF_INET6;
        }
    }
    return 0;
}

// MARK: UDP segmentation offload (UDP_SEGMENT) and receive offload (UDP_GRO)

#define CSHIMS_SOL_UDP 17
#define CSHIMS_UDP_SEGMENT 103
#define CSHIMS_UDP_GRO 104
/// Room for a UDP_SEGMENT or UDP_GRO message and a pktinfo one.
#define CSHIMS_OFFLOAD_SPACE 96
_Static_assert(CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(struct CShims_in6_pktinfo)) <= CSHIMS_OFFLOAD_SPACE, "offload space");

/// Asks the kernel to hand over runs of datagrams from one sender as one buffer (UDP_GRO).
static inline int CShims_enable_udp_gro(int fd) {
    int on = 1;
    return setsockopt(fd, CSHIMS_SOL_UDP, CSHIMS_UDP_GRO, &on, sizeof on);
}

/// The size of each datagram in a buffer the kernel joined (UDP_GRO); 0 when it is one datagram.
static inline int CShims_read_gro_size(const struct msghdr *message) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)message); c; c = CMSG_NXTHDR((struct msghdr *)message, c)) {
        if (c->cmsg_level == CSHIMS_SOL_UDP && c->cmsg_type == CSHIMS_UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int size;
            memcpy(&size, CMSG_DATA(c), sizeof size);
            return size;
        }
    }
    return 0;
}

/// Control messages for one send of several datagrams: the kernel cuts the message's bytes into
/// datagrams of `segment` bytes (UDP_SEGMENT; 0: one datagram), each from `address` when given
/// (`family` AF_INET or AF_INET6; 0: no pktinfo). `control` has CSHIMS_OFFLOAD_SPACE bytes.
static inline void CShims_write_offload(struct msghdr *message, void *control, unsigned short segment, int family,
                                        const unsigned char *address) {
    memset(control, 0, CSHIMS_OFFLOAD_SPACE);
    message->msg_control = control;
    message->msg_controllen = CSHIMS_OFFLOAD_SPACE;
    struct cmsghdr *c = CMSG_FIRSTHDR(message);
    size_t used = 0;
    if (segment > 0) {
        c->cmsg_level = CSHIMS_SOL_UDP;
        c->cmsg_type = CSHIMS_UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(unsigned short));
        memcpy(CMSG_DATA(c), &segment, sizeof segment);
        used += CMSG_SPACE(sizeof(unsigned short));
        c = CMSG_NXTHDR(message, c);
    }
    if (family == AF_INET6) {
        struct CShims_in6_pktinfo v6;
        memset(&v6, 0, sizeof v6);
        memcpy(&v6.ipi6_addr, address, 16);
        c->cmsg_level = IPPROTO_IPV6;
        c->cmsg_type = CSHIMS_IPV6_PKTINFO;
        c->cmsg_len = CMSG_LEN(sizeof v6);
        memcpy(CMSG_DATA(c), &v6, sizeof v6);
        used += CMSG_SPACE(sizeof v6);
    } else if (family == AF_INET) {
        struct CShims_in_pktinfo v4;
        memset(&v4, 0, sizeof v4);
        memcpy(&v4.ipi_spec_dst, address, 4);
        c->cmsg_level = IPPROTO_IP;
        c->cmsg_type = IP_PKTINFO;
        c->cmsg_len = CMSG_LEN(sizeof v4);
        memcpy(CMSG_DATA(c), &v4, sizeof v4);
        used += CMSG_SPACE(sizeof v4);
    }
    message->msg_controllen = used;
    if (used == 0) message->msg_control = NULL;
}

/// Sets the source address of a datagram to send: one pktinfo control message in `control`
/// (CSHIMS_OFFLOAD_SPACE bytes), `address` 4 (AF_INET) or 16 (AF_INET6) bytes.
static inline void CShims_write_pktinfo(struct msghdr *message, void *control, int family, const unsigned char *address) {
    CShims_write_offload(message, control, 0, family, address);
}

/// Makes stdout line-buffered, also when it is a pipe or a file.
static inline void CShims_line_buffer_stdout(void) { setvbuf(stdout, NULL, _IOLBF, 0); }

/// What the kernel says of a TCP socket's sending (TCP_INFO): unsent bytes and the delivery
/// rate in bytes a second (0 before it knows). -1 on failure. In shims.c, which alone includes
/// linux/tcp.h (it clashes with netinet/tcp.h).
int CShims_tcp_sending(int fd, uint64_t *unsent, uint64_t *delivery_rate);

#endif
