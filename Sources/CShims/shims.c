// Most shims are header-only; this file gives the target a translation unit, and holds what needs
// headers of its own.
#include "CShims.h"
#include <stddef.h>

#include <linux/tcp.h>

/// What the kernel says of a TCP socket's sending: unsent bytes, and the rate it delivers at
/// (bytes a second; 0 before it knows). -1 on failure.
int CShims_tcp_sending(int fd, uint64_t *unsent, uint64_t *delivery_rate) {
    struct tcp_info info;
    socklen_t length = sizeof(info);
    memset(&info, 0, sizeof(info));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return -1;
    *unsent = length >= offsetof(struct tcp_info, tcpi_notsent_bytes) + sizeof(info.tcpi_notsent_bytes) ? info.tcpi_notsent_bytes : 0;
    *delivery_rate = length >= offsetof(struct tcp_info, tcpi_delivery_rate) + sizeof(info.tcpi_delivery_rate) ? info.tcpi_delivery_rate : 0;
    return 0;
}
